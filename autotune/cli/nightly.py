"""``autotune nightly --config FILE``, ``nightly history`` and ``nightly rollback``
(docs/nightly.md). Exit status: 0 keep, 3 promoted, 4 nothing feasible, 6 busy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from autotune.cli._app import app, print_json
from autotune.cli.database import StorageOpt, open_store
from autotune.cli.progress import progress_printer
from autotune.errors import ConfigError
from autotune.nightly.job_config import load_nightly_config
from autotune.nightly.job_records import DecisionRecord, decisions

__all__ = ["decision_lines", "history", "nightly", "rollback_cmd"]

nightly_app = typer.Typer(
    help="Nightly retuning: refresh, drift, warm start, promote or keep (docs/nightly.md).",
    invoke_without_command=True,
)
app.add_typer(nightly_app, name="nightly")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f} %"


def decision_lines(d: DecisionRecord) -> list[str]:
    gain = (
        f"gain {_pct(d.gain_pct)} ({100 * (d.confidence or 0.95):.0f} % CI "
        f"{_pct(d.gain_low)} … {_pct(d.gain_high)})"
        if d.gain_pct is not None
        else "gain: n/a"
    )
    lines = [
        f"{d.deployment}: {d.decision}{' (dry run)' if d.dry_run else ''} "
        f"[{d.created_at:%Y-%m-%d %H:%M} UTC, study {d.study_name or '-'}]",
        f"  reason: {d.reason}",
        f"  {gain}",
    ]
    drift = d.drift or {}
    if drift:
        lines.append(
            "  drift: "
            + (
                "first run"
                if drift.get("first_run")
                else "; ".join(drift.get("reasons") or []) or "none"
            )
        )
    if d.challenger is not None:
        lines.append(f"  challenger: {d.challenger}")
    lines.append(f"  in use: {d.deployed}")
    if d.command:
        lines.append(f"  {d.command}")
    return lines


def _parse_at(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        msg = f"{text!r} is not an ISO 8601 date or time"
        raise typer.BadParameter(msg, param_hint="'--at'") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@nightly_app.callback()
def nightly(
    ctx: typer.Context,
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="the nightly config (YAML)")
    ] = None,
    skip_if_no_drift: Annotated[
        bool, typer.Option("--skip-if-no-drift", help="keep without a study when nothing drifted")
    ] = False,
    progress: Annotated[bool, typer.Option("--progress", help="print each trial")] = False,
    storage: StorageOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the decision as JSON")] = False,
    at: Annotated[
        str | None,
        typer.Option("--at", help="run as of this UTC date or time (ISO 8601; a backfill)"),
    ] = None,
) -> None:
    """Run the nightly job of one deployment: exit 0 keep, 3 promoted."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        raise ConfigError("autotune nightly needs --config FILE (the nightly config)")
    from autotune.nightly.job import run_nightly

    when = _parse_at(at) if at is not None else None
    cfg = load_nightly_config(config)
    store = open_store(storage, cfg.storage)
    try:
        res = run_nightly(
            cfg,
            store,
            skip_if_no_drift=skip_if_no_drift,
            on_event=progress_printer() if progress else None,
            now=(lambda: when) if when is not None else None,
        )
    finally:
        store.close()
    if json_out:
        print_json(res.decision.to_dict())
    else:
        for line in decision_lines(res.decision):
            print(line)
        if res.decision.output_path and res.output_written:
            print(f"  wrote {res.decision.output_path}")
    raise typer.Exit(res.exit_code)


@nightly_app.command("history")
def history(
    deployment: str,
    storage: StorageOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """A deployment's decisions, oldest first."""
    store = open_store(storage, create=False)
    try:
        rows = decisions(store, deployment)
    finally:
        store.close()
    if json_out:
        print_json([d.to_dict() for d in rows])
        return
    if not rows:
        print(f"deployment {deployment!r} has no decisions yet")
        return
    for d in rows:
        print("\n".join(decision_lines(d)))


@nightly_app.command("rollback")
def rollback_cmd(
    deployment: str,
    output: Annotated[
        str | None, typer.Option("--output", help="where to write (default: the last output)")
    ] = None,
    storage: StorageOpt = None,
) -> None:
    """Re-emit the config in use before the last change (recorded as a decision)."""
    from autotune.nightly.job import rollback

    store = open_store(storage, create=False)
    try:
        rec = rollback(store, deployment, output=output)
    finally:
        store.close()
    print("\n".join(decision_lines(rec)))
    if rec.output_path:
        print(f"  wrote {rec.output_path}")
