"""``autotune study ...`` and ``autotune db upgrade``: plain functions over the controller."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from autotune.cli._app import app, console
from autotune.config import load_config
from autotune.errors import ConfigError, StorageError
from autotune.report.recommend import (
    export_csv,
    export_json,
    format_recommendation,
    recommend,
    trial_rows,
)
from autotune.store import Store
from autotune.store.db import ENV_VAR
from autotune.tuning.controller import config_yaml_of, create_study, load_study_config, run_study

__all__ = ["best", "create", "delete", "export", "list_cmd", "run_cmd", "show", "upgrade"]

study_app = typer.Typer(help="Create, run and inspect tuning studies.", no_args_is_help=True)
db_app = typer.Typer(help="The study database.", no_args_is_help=True)
app.add_typer(study_app, name="study")
app.add_typer(db_app, name="db")

StorageOpt = Annotated[str | None, typer.Option(
    "--storage", help=f"database URL (default: ${ENV_VAR}, the config's, or sqlite:///autotune.db)")]


def _quiet_optuna() -> None:
    # Optuna logs every study creation at INFO on stderr; our own output says what happened.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _open(storage: str | None, config_storage: str | None = None) -> Store:
    _quiet_optuna()
    return Store.open(storage or os.environ.get(ENV_VAR) or config_storage)


def _progress(total: int | None) -> Any:
    out = console()

    planned = [0]

    def on_event(kind: str, d: Any) -> None:
        if kind == "run_start":
            planned[0] = d["planned"]
            out.print(f"plan: {d['planned']} trials ({d['done']} done)")
        elif kind == "trial_start":
            ea = d["engine_args"]
            of = f" of {planned[0]}" if planned[0] else ""
            out.print(f"[bold]trial {d['number'] + 1}{of}[/bold] {escape('[' + d['stage'] + ']')} "
                      f"max_model_len={ea['max_model_len']} "
                      f"gpu_memory_utilization={ea['gpu_memory_utilization']} "
                      f"max_num_seqs={ea['max_num_seqs']} "
                      f"max_num_batched_tokens={ea['max_num_batched_tokens']}")
        elif kind == "level_progress" and out.is_terminal:  # live replay (HTTP workers)
            p99 = f"{d['p99_ttft_ms']:,.0f} ms" if d["p99_ttft_ms"] is not None else "-"
            out.print(f"    load x{d['scale']:.2f}: sent {d['sent']}/{d['planned']}, completed "
                      f"{d['completed']}, failed {d['failed']}, p99 TTFT so far {p99}",
                      end="\r")
        elif kind == "level_done":
            m = d["metrics"]
            out.print(f"    load x{d['scale']:.2f}: {m.get('output_throughput', 0):,.0f} tok/s, "
                      f"p99 TTFT {m.get('p99_ttft_ms') or 0:,.0f} ms, "
                      f"p99 TPOT {m.get('p99_tpot_ms') or 0:,.1f} ms, "
                      f"failed {m.get('failed', 0)} -> "
                      f"{'ok' if d['feasible'] else 'violates SLO'}")
        elif kind == "worker_failed":
            out.print(f"    worker failed: {d['failure_class']}: {d['message']}")
        elif kind == "trial_done":
            verdict = "feasible" if d["feasible"] else "infeasible"
            out.print(f"  -> {d['objective']:,.1f} tok/s, {verdict}"
                      + (f" ({d['failure_class']})" if d["failure_class"] else ""))
    return on_event


@study_app.command("create")
def create(
    config: Annotated[Path, typer.Option("--config", help="study YAML")],
    storage: StorageOpt = None,
    run: Annotated[bool, typer.Option("--run", help="run the study right away")] = False,
    n_trials: Annotated[int | None, typer.Option(help="with --run: at most N trials")] = None,
) -> None:
    """Create a study from a config file (and optionally run it)."""
    cfg = load_config(config)
    with _open(storage, cfg.storage) as store:
        rec = create_study(cfg, config_yaml_of(config), store)
        prof = rec.workload_profile
        console().print(
            f"study {rec.name!r} created in {store.url.split('@')[-1]}: {cfg.mode}, worker "
            f"{cfg.worker.kind}, {prof['num_requests']} requests (p99 prompt+output "
            f"{prof['total_len']['p99']:.0f} tokens)")
        if run:
            _run(store, rec.name, n_trials, None)


def _run(store: Store, name: str, n_trials: int | None, timeout: float | None,
         reset_running: bool = False) -> None:
    report = run_study(name, store, n_trials=n_trials, timeout=timeout,
                       on_event=_progress(n_trials), reset_running=reset_running)
    console().print(f"{report.trials_run} trial(s) run ({report.stopped_by}).")
    cfg = load_study_config(store.get_study(name))  # type: ignore[arg-type]
    rec = recommend(cfg, store.trials(name))
    if rec is None:
        console().print("no feasible configuration yet.")
    else:
        print(format_recommendation(rec))


@study_app.command("run")
def run_cmd(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOpt = None,
    n_trials: Annotated[int | None, typer.Option(help="at most N trials this run")] = None,
    timeout: Annotated[float | None, typer.Option(help="stop after S seconds")] = None,
    fail_running: Annotated[bool, typer.Option(
        "--fail-running", help="first mark trials a killed run left RUNNING as failed (not "
        "while other controllers share the study)")] = False,
) -> None:
    """Run (or resume) a study. Several controllers may run one study at once (Postgres)."""
    with _open(storage) as store:
        _run(store, name, n_trials, timeout, fail_running)


@study_app.command("list")
def list_cmd(storage: StorageOpt = None) -> None:
    """List the studies in the database."""
    with _open(storage) as store:
        studies = store.list_studies()
    table = Table(title="studies")
    for col in ("name", "mode", "worker", "created", "trials", "complete", "best tok/s"):
        table.add_column(col)
    for s in studies:
        table.add_row(s.name, s.mode, s.worker_kind, s.created_at.strftime("%Y-%m-%d %H:%M"),
                      str(s.n_trials), str(s.n_complete),
                      f"{s.best_objective:,.1f}" if s.best_objective is not None else "-")
    console().print(table)


def _need(store: Store, name: str) -> Any:
    rec = store.get_study(name)
    if rec is None:
        raise StorageError(f"no study named {name!r}; `autotune study list` shows the studies")
    return rec


@study_app.command("show")
def show(name: Annotated[str, typer.Argument()], storage: StorageOpt = None) -> None:
    """Trials with their engine args, p99s, throughput, feasibility and failure class."""
    with _open(storage) as store:
        _need(store, name)
        rows = trial_rows(store.trials(name))
    table = Table(title=f"study {name}")
    cols = ("trial", "stage", "max_model_len", "gpu_memory_utilization", "max_num_seqs",
            "max_num_batched_tokens", "objective", "feasible", "capacity_scale", "p99_ttft_ms",
            "p99_tpot_ms", "failure_class", "diagnosis")
    for c in cols:
        table.add_column(c.replace("_", " "))

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:,.2f}" if isinstance(v, float) else str(v)
    for r in rows:
        table.add_row(*(fmt(r[c]) for c in cols))
    console().print(table)


@study_app.command("best")
def best(name: Annotated[str, typer.Argument()], storage: StorageOpt = None) -> None:
    """The recommended `vllm serve` command, its engine args (YAML) and the gain."""
    with _open(storage) as store:
        rec = _need(store, name)
        r = recommend(load_study_config(rec), store.trials(name))
    if r is None:
        raise ConfigError(f"study {name!r} has no feasible trial yet; run it longer or relax "
                          "its SLOs (`autotune study show` lists the violations)")
    print(format_recommendation(r))


@study_app.command("export")
def export(
    name: Annotated[str, typer.Argument()],
    fmt: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
    storage: StorageOpt = None,
) -> None:
    """Export the study and every trial (params, state, failure class, levels, metrics)."""
    if fmt not in ("json", "csv"):
        raise ConfigError(f"--format must be json or csv, not {fmt!r}")
    with _open(storage) as store:
        rec = _need(store, name)
        trials = store.trials(name)
    text = export_json(rec, trials) if fmt == "json" else export_csv(trials)
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            output.write_text(text)
        except OSError as exc:
            raise ConfigError(f"{output}: cannot write ({exc.strerror})") from exc


@study_app.command("delete")
def delete(name: Annotated[str, typer.Argument()], storage: StorageOpt = None) -> None:
    """Delete a study (ours and Optuna's records)."""
    with _open(storage) as store:
        store.delete_study(name)
    print(f"study {name!r} deleted")


@db_app.command("upgrade")
def upgrade(storage: StorageOpt = None) -> None:
    """Create or upgrade autotune's tables (Postgres needs this once; SQLite is automatic)."""
    with Store.open(storage or os.environ.get(ENV_VAR), upgrade=True) as store:
        print(f"database {store.url.split('@')[-1]} at revision {store.current_revision()}")
