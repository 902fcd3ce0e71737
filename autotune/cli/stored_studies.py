"""``autotune study list/show/status/best/export/delete``: the commands over studies already
in the database."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune.cli import study as _study  # noqa: F401  (create and run come first in --help)
from autotune.cli._app import console, print_json, study_app
from autotune.cli.database import StorageOpt, need_study, open_store, study_store
from autotune.errors import ConfigError, NotFoundError
from autotune.gitrecord.study_record import commit_study
from autotune.report.best_output import (
    best_json,
    format_recommendation,
    format_validation,
    study_hints,
    validation_block,
)
from autotune.report.lowload import below_lowest_load, lower_capacity_low_hint
from autotune.report.recommend import no_feasible_reason, recommend
from autotune.report.request_export import REQUEST_FORMATS, request_exports, write_exports
from autotune.report.study_export import export_csv, export_json
from autotune.report.tables import (
    list_json,
    list_table,
    show_json,
    show_rows,
    show_table,
    spread_lines,
)
from autotune.report.twin_summary import twin_lines
from autotune.store import NoDatabaseError
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.interval import summary_of
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.run.create import load_study_config
from autotune.tuning.run.status import study_plan, study_status
from autotune.tuning.study_attrs import stored_noise, stored_twin

__all__ = ["JsonOpt", "best", "delete", "export", "list_cmd", "show", "status"]

JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="print JSON (schema: docs/report.md#5-machine-readable-output)"),
]


@study_app.command("list")
def list_cmd(storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """List the studies in the database (none when the database does not exist yet)."""
    try:
        with open_store(storage, create=False) as store:
            studies = store.list_studies()
    except NoDatabaseError:
        studies = []
    if as_json:
        print_json(list_json(studies))
    else:
        console().print(list_table(studies))


@study_app.command("show")
def show(
    name: Annotated[str, typer.Argument()],
    storage: StorageOpt = None,
    as_json: JsonOpt = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="every column at full width (default: fit the terminal)")
    ] = False,
) -> None:
    """Trials with their state, engine args, output tok/s, capacity, p99s and violations."""
    with study_store(storage, name) as store:
        study = need_study(store, name)
        trials = store.trials(name)
        plan = study_plan(store, name)
        repeats = store.repeats(name)
        noise = stored_noise(store, name)
        twin = twin_lines(*stored_twin(store, name), trials)
    cfg = load_study_config(study)
    lattice = lattice_of(cfg)
    rec = recommend(cfg, trials, repeats, noise)
    cost = study_cost(trials, repeats)
    # the validation's verdict and each re-measured config's validated figures, and what to
    # change in the config (docs/tuning.md#7-validation, docs/usage.md#1-commands)
    validation = [] if rec is None or rec.validation is None else format_validation(rec)
    validation += validation_block(rec) if rec is not None else []
    hints = study_hints(rec) if rec is not None else []
    if as_json:
        extra = best_json(name, rec) if rec is not None else {}
        print_json(
            show_json(name, study.mode, trials, lattice)
            | {
                "plan": plan,
                "cost": cost.to_dict(),
                "validation": {
                    "verdict": extra["gain"]["verdict"],
                    "reason": extra["gain"]["reason"],
                    "configs": extra["validated"],
                }
                if rec is not None and rec.validated
                else None,
                "hints": hints,
                "twin": twin,
            }
        )
        return
    width = console().width
    rows = show_rows(trials, study.mode, lattice)
    table, legend, at = show_table(name, rows, width, wide=wide)
    Console(width=at).print(table)  # at: the table's own width when the terminal is narrower
    if legend:
        Console(width=width).print(escape(legend), highlight=False)
    for line in plan:
        Console(width=width).print(f"plan: {escape(line)}", highlight=False)
    for line in twin:  # docs/tuning.md#15-the-twin-strategy
        Console(width=width).print(escape(line), highlight=False)
    Console(width=width).print(escape(cost.text), highlight=False)
    for line in spread_lines(trials, study.mode, lattice) + validation + hints:
        Console(width=width).print(escape(line), highlight=False)


@study_app.command("status")
def status(name: Annotated[str, typer.Argument()], storage: StorageOpt = None) -> None:
    """Who runs the study: controllers (host, pid, last heartbeat), running trials with
    their workers, claims and retries."""
    with study_store(storage, name) as store:
        need_study(store, name)
        st = study_status(store, name)
    out = console()
    table = Table(title=f"controllers of {name}")
    for col in ("id", "host", "pid", "state", "last heartbeat", "idle s", "trials", "note"):
        table.add_column(col)
    for c in st.controllers:
        table.add_row(
            str(c.id),
            c.host,
            str(c.pid),
            c.state,
            f"{c.heartbeat_age_s:,.0f} s ago",
            f"{c.idle_s:,.1f}",
            str(c.trials_run),
            escape(c.note or ""),
        )
    out.print(table)
    running = Table(title="running trials")
    for col in ("trial", "stage", "controller", "devices", "worker group", "started"):
        running.add_column(col)
    for r in st.running:
        running.add_row(
            str(r.number),
            r.stage,
            r.controller,
            r.devices or "-",
            r.workers or "-",
            r.started.strftime("%H:%M:%S") if r.started else "-",
        )
    out.print(running)
    out.print(
        f"claims: {st.claims} ({st.open_claims} open); queued: {st.waiting}; "
        f"complete: {st.complete} of {st.planned} planned"
        + (f" ({st.settled} settled)" if st.settled else "")
        + f"; failed: {st.failed}"
    )
    for line in st.retries:
        out.print(f"retry: {escape(line)}")


@study_app.command("best")
def best(
    name: Annotated[str, typer.Argument()], storage: StorageOpt = None, as_json: JsonOpt = False
) -> None:
    """The recommended `vllm serve` command, its engine args (YAML) and the gain."""
    with study_store(storage, name) as store:
        rec = need_study(store, name)
        trials = store.trials(name)
        repeats = store.repeats(name)
        r = recommend(load_study_config(rec), trials, repeats, stored_noise(store, name))
    cost = study_cost(trials, repeats)
    if r is None:
        low = below_lowest_load(trials, rec.mode)
        hint = (
            lower_capacity_low_hint(low) if low is not None else "run it longer or relax its SLOs"
        )
        raise NotFoundError(
            f"study {name!r} has no feasible trial ({no_feasible_reason(trials, rec.mode)}); "
            f"{hint} (`autotune study show` lists each trial's violations)"
        )
    if as_json:
        print_json(best_json(name, r) | {"cost": cost.to_dict()})
    else:
        print(format_recommendation(r))
        print(cost.text)
    if r.undecided:
        # no config held its SLOs in every validation run: no command is recommended, and
        # the status says so as for a study without a feasible trial (docs/tuning.md#7-validation)
        raise typer.Exit(NotFoundError.exit_code)


@study_app.command("export")
def export(
    name: Annotated[str, typer.Argument()],
    fmt: Annotated[
        str, typer.Option("--format", help="json, csv, requests-jsonl or llmd-report")
    ] = "json",
    output: Annotated[Path | None, typer.Option("--output", "--out", "-o")] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help="json: keep each level's telemetry, full metrics and evidence"),
    ] = False,
    storage: StorageOpt = None,
    trial: Annotated[
        int | None,
        typer.Option("--trial", help="requests-jsonl, llmd-report: the trial (default: best)"),
    ] = None,
    level: Annotated[
        str | None,
        typer.Option("--level", help="requests-jsonl, llmd-report: level index or all"),
    ] = None,
    git: Annotated[
        Path | None,
        typer.Option(
            "--git",
            metavar="DIR",
            help="commit every trial, the validation and the recommendation to git in "
            "folder DIR instead (docs/git-record.md)",
        ),
    ] = None,
) -> None:
    """Export the study and every trial (params, state, failure class, levels, violations);
    each level's telemetry, full metrics and diagnosis evidence only with --full.
    requests-jsonl and llmd-report export one level (docs/report.md#8-per-request-exports)."""
    if git is not None:  # the whole stored history, as record.git commits it in a run
        _export_git(name, storage, git)
        return
    if fmt in REQUEST_FORMATS:
        with study_store(storage, name) as store:
            files = request_exports(store, name, fmt, trial=trial, level=level)
        write_exports(files, output)
        return
    if fmt not in ("json", "csv"):
        raise ConfigError(
            f"--format must be json, csv, {' or '.join(REQUEST_FORMATS)}, not {fmt!r}"
        )
    if trial is not None or level is not None:
        raise ConfigError(f"--trial and --level go with --format {' or '.join(REQUEST_FORMATS)}")
    with study_store(storage, name) as store:
        rec = need_study(store, name)
        trials = store.trials(name)
        repeats = store.repeats(name)
        noise = stored_noise(store, name)
    cfg = load_study_config(rec)
    text = (
        export_json(rec, trials, repeats, cfg, full=full, noise=noise)
        if fmt == "json"
        else export_csv(
            trials, rec.mode, summary_of(cfg, repeats, trials, noise), cfg=cfg, repeats=repeats
        )
    )
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            output.write_text(text)
        except OSError as exc:
            raise ConfigError(f"{output}: cannot write ({exc.strerror})") from exc


def _export_git(name: str, storage: str | None, folder: Path) -> None:
    """``study export NAME --git DIR``: the commits DIR's repository lacks, in trial order
    (docs/git-record.md); git's failure is the command's error."""
    with study_store(storage, name) as store:
        cfg = load_study_config(need_study(store, name))
        done = commit_study(cfg, store, folder)
    console().print(
        escape(f"{done.commits} commit(s) in {done.top} (folder {done.rel})"), highlight=False
    )


@study_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument()],
    storage: StorageOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Delete a study (ours and Optuna's records); asks first unless --yes."""
    with study_store(storage, name) as store:
        rec = need_study(store, name)
        n = len(store.trials(name))
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigError(
                    f"study delete {name}: refusing to delete {n} trial(s) without asking; "
                    "stdin is not a terminal, so pass --yes"
                )
            if not typer.confirm(
                f"Delete study {rec.name!r} and its {n} trial(s) from {store.url.split('@')[-1]}?",
                default=False,
            ):
                print(f"study {name!r} kept")
                raise typer.Exit(1)
        store.delete_study(name)
    print(f"study {name!r} deleted")
