"""``autotune study ...`` and ``autotune db upgrade``: plain functions over the controller."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune import preflight, sizing
from autotune.cli._app import app, console, print_json
from autotune.config import MAX_TIMEOUT_S, MAX_TRIALS, parse_config, read_config_text, source_map
from autotune.errors import ConfigError, NotFoundError, StorageError
from autotune.inputs import MAX_CONFIG_BYTES
from autotune.report import dashboard
from autotune.report.levels import progress_figures, stop_note
from autotune.report.lowload import below_lowest_load, lower_capacity_low_hint
from autotune.report.recommend import (
    best_json,
    capacity_rps,
    export_csv,
    export_json,
    format_recommendation,
    no_feasible_reason,
    recommend,
    why_infeasible,
)
from autotune.report.tables import list_json, list_table, show_json, show_rows, show_table
from autotune.store import NoDatabaseError, Store, StudyRecord, resolve_url
from autotune.store.db import ENV_VAR
from autotune.tuning.controller import create_study, load_study_config, run_study
from autotune.tuning.events import (
    Event,
    LevelDone,
    LevelProgress,
    OnEvent,
    RunStart,
    TrialAbandoned,
    TrialDone,
    TrialStart,
    ValidationRunDone,
    ValidationStart,
    Waiting,
    WorkerDied,
    WorkerFailed,
)
from autotune.tuning.interval import summary_of
from autotune.tuning.lanes import parse_devices, plan_lanes
from autotune.tuning.status import study_plan, study_status
from autotune.tuning.stopping import Interrupted

__all__ = [
    "JsonOpt",
    "StorageOpt",
    "best",
    "create",
    "delete",
    "export",
    "list_cmd",
    "need_study",
    "open_store",
    "progress_printer",
    "run_cmd",
    "show",
    "status",
    "study_store",
    "upgrade",
]

study_app = typer.Typer(help="Create, run and inspect tuning studies.", no_args_is_help=True)
db_app = typer.Typer(help="The study database.", no_args_is_help=True)
app.add_typer(study_app, name="study")
app.add_typer(db_app, name="db")

StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help=f"database URL (default: ${ENV_VAR}, the config's, or sqlite:///autotune.db)",
    ),
]


def _quiet_optuna() -> None:
    # Optuna logs every study creation at INFO on stderr; our own output says what happened.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _url(storage: str | None, config_storage: str | None = None) -> str | None:
    """The database setting that applies (--storage, $AUTOTUNE_DATABASE_URL, the config's);
    one that is not a URL is refused naming the setting it came from."""
    if storage is not None and not storage.strip():
        # an empty --storage once fell back to the default SQLite file without a word
        raise typer.BadParameter("is empty; give a database URL", param_hint="'--storage'")
    url, origin = (
        (storage, "--storage")
        if storage is not None
        else (os.environ.get(ENV_VAR), f"${ENV_VAR}")
        if os.environ.get(ENV_VAR)
        else (config_storage, "the config's storage")
        if config_storage is not None
        else (None, "")
    )
    try:
        resolve_url(url)
    except StorageError as exc:
        raise StorageError(f"{origin}: {exc}") from exc
    return url


def open_store(
    storage: str | None, config_storage: str | None = None, *, create: bool = True
) -> Store:
    """The study database; with ``create=False`` (every command but ``study create`` and
    ``db upgrade``) never a new one: a SQLite file that does not exist is
    :class:`NoDatabaseError`."""
    _quiet_optuna()
    return Store.open(_url(storage, config_storage), create=create)


JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="print JSON (schema: docs/report.md#5-machine-readable-output)"),
]


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


_N_TRIALS_HELP = "at most N trials (N >= 1)"

GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="run trials in parallel on these devices, e.g. 0,1,2,3 (each trial gets its own "
        "share as CUDA_VISIBLE_DEVICES; overrides worker.gpus)",
    ),
]
GpusPerTrialOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-trial",
        min=1,
        help="with --gpus: devices per trial (default: the study's tensor_parallel_size, else 1)",
    ),
]


def _check_gpus(gpus: str | None, per_trial: int | None) -> None:
    """What the flags alone get wrong, as usage errors; what conflicts with the study's
    config is found when the run loads it (autotune.tuning.lanes.plan_lanes)."""
    if gpus is None:
        if per_trial is not None:
            raise typer.BadParameter("applies only with --gpus", param_hint="'--gpus-per-trial'")
        return
    try:
        devices = parse_devices(gpus)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--gpus'") from None
    if per_trial is not None and len(devices) % per_trial:
        raise typer.BadParameter(
            f"{per_trial} does not divide the {len(devices)} device(s) of --gpus {gpus}: "
            "every trial gets exactly that many, so give a multiple of it",
            param_hint="'--gpus-per-trial'",
        )


_FIELD = re.compile(r"[A-Za-z_]\w*(\[\d+\])?(\.[A-Za-z_]\w*(\[\d+\])?)*")


def _located(exc: ConfigError, text: str, source: str) -> ConfigError:
    """A create-time error naming a field (``search.max_model_len: ...``,
    ``enqueue[0].max_model_len: ...``) with the file and line of that field prepended."""
    msg = str(exc)
    head = msg.split(": ", 1)[0]
    if not _FIELD.fullmatch(head):
        return exc  # not a field's message (a path, a file:line already)
    path: list[str | int] = []
    for part in head.replace("]", "").split("."):
        name, _, idx = part.partition("[")
        path.append(name)
        if idx.isdigit():
            path.append(int(idx))
    return ConfigError(f"{source_map(text, source).where(tuple(path))}: {msg}")


def _rate(rps: float | None) -> str:
    return f" ({rps:,.2f} req/s)" if rps is not None else ""


def progress_printer() -> OnEvent:
    """Progress lines. Trial numbers are Optuna's (0-based, as `study show` and `best` print
    them); "k of n" counts complete trials against the plan."""
    out = console()

    def on_event(e: Event) -> None:
        # a parallel run's lines name their trial and devices: the lanes' lines interleave
        lane = getattr(e, "lane", None)
        tag = f"trial {getattr(e, 'number', None)} on gpu {lane.devices}: " if lane else ""
        match e:
            case RunStart():
                limit = f", stops after {e.timeout_s:,.0f} s" if e.timeout_s else ""
                lanes = e.lanes
                par = f"; {len(lanes)} at a time on gpu {' | '.join(lanes)}" if lanes else ""
                out.print(f"plan: {e.planned} trials ({e.done} done{limit}{par})")
                for line in e.recovered:  # what dead runs left, and how it was fixed
                    out.print(f"recovered: {escape(line)}")
            case Waiting():  # other controllers run the rest of the stage
                out.print(f"waiting: {escape(e.reason)}")
            case TrialAbandoned():
                print(f"{e.line}", file=sys.stderr)
            case TrialStart():
                ea = e.engine_args
                pos = e.position
                of = f" ({pos[0]} of {pos[1]})" if pos else ""
                on = f" on gpu {lane.devices}" if lane else ""
                out.print(
                    f"[bold]trial {e.number}{of}[/bold]{on} {escape('[' + e.stage + ']')} "
                    f"max_model_len={ea['max_model_len']} "
                    f"gpu_memory_utilization={ea['gpu_memory_utilization']} "
                    f"max_num_seqs={ea['max_num_seqs']} "
                    f"max_num_batched_tokens={ea['max_num_batched_tokens']}"
                )
            case LevelProgress() if out.is_terminal and not tag:  # live replay (HTTP)
                p99 = f"{e.p99_ttft_ms:,.0f} ms" if e.p99_ttft_ms is not None else "-"
                out.print(
                    f"    load x{e.scale:.3f}: sent {e.sent}/{e.planned}, completed "
                    f"{e.completed}, failed {e.failed}, p99 TTFT so far {p99}",
                    end="\r",
                )
            case LevelDone():
                m = e.metrics
                verdict = "ok" if e.feasible else escape("; ".join(e.violations) or "violates")
                verdict += stop_note(m.summary)  # docs/tuning.md#10-early-stop-inside-a-level
                out.print(
                    f"    {tag}load x{e.scale:.3f}{_rate(e.offered_rate)}: "
                    f"{progress_figures(m)} -> {verdict}"
                )
            case WorkerFailed():
                out.print(f"    {tag}worker failed: {e.failure_class}: {escape(e.message)}")
            case WorkerDied():  # mid-level: the level stopped, its partial results kept
                what = "hung" if e.failure_class == "HUNG" else "died"  # a hang is no death
                out.print(
                    f"    {tag}load x{e.scale:.2f}: worker {what} ({e.failure_class}): "
                    f"{escape(e.message)}; level stopped, partial results kept"
                )
            case ValidationStart():
                out.print(
                    f"validation: re-measuring the top configs and the baseline on fresh "
                    f"workload samples ({e.pending} of {e.planned} runs to go)"
                )
            case ValidationRunDone():
                res = e.result
                fig = (
                    f"x{res.capacity_scale:.3f}"
                    if e.mode == "slo-capacity" and res.capacity_scale is not None
                    else f"{res.objective:,.0f} tok/s"
                    if res.objective is not None
                    else "-"
                )
                verdict = "ok" if res.slo_held else escape("; ".join(res.violations) or "violates")
                out.print(
                    f"  repeat {e.repeat} trial {e.trial} {escape('[' + e.role + ']')} "
                    f"({e.done} of {e.planned}): {fig} -> {verdict}"
                )
            case TrialDone():
                rec = e.record
                if e.feasible:
                    cap = e.capacity_scale
                    at = f" at x{cap:.3f}{_rate(capacity_rps(rec))}" if cap is not None else ""
                    out.print(f"  -> {tag}{e.objective:,.1f} output tok/s{at}")
                else:
                    why = why_infeasible(rec, e.mode) or "infeasible"
                    out.print(f"  -> {tag}infeasible: {escape(why)}")
            case _:  # level starts, validation runs starting and done: no line
                pass

    return on_event


@study_app.command("create")
def create(
    config: Annotated[Path, typer.Option("--config", help="study YAML")],
    storage: StorageOpt = None,
    run: Annotated[bool, typer.Option("--run", help="run the study right away")] = False,
    n_trials: Annotated[
        int | None, typer.Option(min=1, max=MAX_TRIALS, help="with --run: " + _N_TRIALS_HELP)
    ] = None,
    max_config_bytes: Annotated[
        int,
        typer.Option(
            "--max-config-bytes",
            min=1,
            help=f"refuse a larger config file (default {MAX_CONFIG_BYTES:,})",
        ),
    ] = MAX_CONFIG_BYTES,
    allow_large_workload: Annotated[
        bool,
        typer.Option(
            "--allow-large-workload",
            help=f"create even when the workload's estimated memory exceeds "
            f"{sizing.LIMIT_BYTES / 1e9:g} GB",
        ),
    ] = False,
    gpus: GpusOpt = None,
    gpus_per_trial: GpusPerTrialOpt = None,
) -> None:
    """Create a study from a config file (and optionally run it). Everything that can be
    checked before a launch is checked first: the config, the worker's flags, secrets,
    the workload's size; nothing is stored when a check fails."""
    for flag, value in (("--n-trials N", n_trials), ("--gpus LIST", gpus)):
        if value is not None and not run:
            raise typer.BadParameter(
                f"applies only with --run (or use `autotune study run NAME {flag}`)",
                param_hint=f"'{flag.split()[0]}'",
            )
    _check_gpus(gpus, gpus_per_trial)
    text = read_config_text(config, max_config_bytes)
    cfg = parse_config(text, str(config))
    if gpus is not None:
        plan_lanes(gpus, gpus_per_trial, cfg)  # before anything is stored
    for line in preflight.check(cfg, text, str(config)):
        _warn(line)
    size = preflight.check_size(cfg, text, str(config), allow=allow_large_workload)
    if size is not None:
        console().print(f"workload: {size.describe()}")
    with open_store(storage, cfg.storage) as store:
        try:
            rec = create_study(cfg, preflight.stored_config_text(text), store)
        except ConfigError as exc:
            raise _located(exc, text, str(config)) from exc
        prof = rec.workload_profile
        console().print(
            f"study {rec.name!r} created in {store.url.split('@')[-1]}: {cfg.mode}, worker "
            f"{cfg.worker.kind}, {prof['num_requests']} requests (p99 prompt+output "
            f"{prof['total_len']['p99']:.0f} tokens)"
        )
        if prof.get("dropped_rows"):  # e.g. "1 of 400 rows dropped: output_tokens 0"
            console().print(f"workload: {escape(prof['dropped_rows'])}", highlight=False)
        for line in prof.get("warnings", []):
            _warn(line)
        for line in study_plan(store, rec.name):
            console().print(f"plan: {escape(line)}", highlight=False)
        if run:
            _run(store, rec.name, n_trials, None, gpus=gpus, gpus_per_trial=gpus_per_trial)


def _run(
    store: Store,
    name: str,
    n_trials: int | None,
    timeout: float | None,
    reset_running: bool = False,
    *,
    gpus: str | None = None,
    gpus_per_trial: int | None = None,
) -> None:
    try:
        report = run_study(
            name,
            store,
            n_trials=n_trials,
            timeout=timeout,
            on_event=progress_printer(),
            reset_running=reset_running,
            gpus=gpus,
            gpus_per_trial=gpus_per_trial,
            hooks=dashboard.HOOKS,  # optuna-dashboard's notes and plots
        )
    except Interrupted as exc:  # SIGTERM/SIGHUP: stopped as Ctrl-C stops a run
        what = "every running trial was" if gpus is not None else "the running trial was"
        print(f"{exc}: {what} failed and queued again", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    idle = f", {report.idle_s:,.0f} s idle" if report.idle_s >= 0.5 else ""
    console().print(f"{report.trials_run} trial(s) run ({report.stopped_by}{idle}).")
    cfg = load_study_config(store.get_study(name))  # type: ignore[arg-type]
    trials = store.trials(name)
    rec = recommend(cfg, trials, store.repeats(name))
    if rec is None:
        low = below_lowest_load(trials, cfg.mode)
        if low is not None:
            # running longer measures the same lattice again: say what to lower, exit 4
            raise NotFoundError(
                f"{no_feasible_reason(trials, cfg.mode)}; {lower_capacity_low_hint(low)}"
            )
        console().print(escape(no_feasible_reason(trials, cfg.mode)))
    else:
        print(format_recommendation(rec))


@study_app.command("run")
def run_cmd(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOpt = None,
    n_trials: Annotated[
        int | None, typer.Option(min=1, max=MAX_TRIALS, help=_N_TRIALS_HELP + " this run")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="stop after S seconds (S > 0)")] = None,
    fail_running: Annotated[
        bool,
        typer.Option(
            "--fail-running",
            help="first mark trials a killed run left RUNNING as failed, and its "
            "validation runs as pending (not while other controllers share the study)",
        ),
    ] = False,
    gpus: GpusOpt = None,
    gpus_per_trial: GpusPerTrialOpt = None,
) -> None:
    """Run (or resume) a study. Several controllers may run one study at once (Postgres),
    each with --gpus to run its trials in parallel (docs/parallel.md)."""
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT_S:  # also NaN and inf
        raise typer.BadParameter(
            f"{timeout:g} is not a positive number of seconds (at most {MAX_TIMEOUT_S:.0f})",
            param_hint="'--timeout'",
        )
    _check_gpus(gpus, gpus_per_trial)
    with study_store(storage, name) as store:  # run_study names a missing study
        _run(store, name, n_trials, timeout, fail_running, gpus=gpus, gpus_per_trial=gpus_per_trial)


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


def need_study(store: Store, name: str) -> StudyRecord:
    rec = store.get_study(name)
    if rec is None:
        raise NotFoundError(f"no study named {name!r}; `autotune study list` shows the studies")
    return rec


@contextmanager
def study_store(storage: str | None, name: str) -> Iterator[Store]:
    """The existing database (never a new one) that should hold the study ``name``."""
    try:
        store = open_store(storage, create=False)
    except NoDatabaseError as exc:
        raise NotFoundError(f"no study named {name!r}: {exc}") from exc
    with store:
        yield store


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
    if as_json:
        print_json(show_json(name, study.mode, trials) | {"plan": plan})
        return
    width = console().width
    table, legend, at = show_table(name, show_rows(trials, study.mode), width, wide=wide)
    Console(width=at).print(table)  # at: the table's own width when the terminal is narrower
    if legend:
        Console(width=width).print(escape(legend), highlight=False)
    for line in plan:
        Console(width=width).print(f"plan: {escape(line)}", highlight=False)


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
        f"complete: {st.complete} of {st.planned} planned; failed: {st.failed}"
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
        r = recommend(load_study_config(rec), trials, store.repeats(name))
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
        print_json(best_json(name, r))
    else:
        print(format_recommendation(r))
    if r.undecided:
        # no config held its SLOs in every validation run: no command is recommended, and
        # the status says so as for a study without a feasible trial (docs/tuning.md#7-validation)
        raise typer.Exit(NotFoundError.exit_code)


@study_app.command("export")
def export(
    name: Annotated[str, typer.Argument()],
    fmt: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help="json: keep each level's telemetry, full metrics and evidence"),
    ] = False,
    storage: StorageOpt = None,
) -> None:
    """Export the study and every trial (params, state, failure class, levels, violations);
    each level's telemetry, full metrics and diagnosis evidence only with --full."""
    if fmt not in ("json", "csv"):
        raise ConfigError(f"--format must be json or csv, not {fmt!r}")
    with study_store(storage, name) as store:
        rec = need_study(store, name)
        trials = store.trials(name)
        repeats = store.repeats(name)
    cfg = load_study_config(rec)
    text = (
        export_json(rec, trials, repeats, cfg, full=full)
        if fmt == "json"
        else export_csv(trials, rec.mode, summary_of(cfg, repeats, trials))
    )
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            output.write_text(text)
        except OSError as exc:
            raise ConfigError(f"{output}: cannot write ({exc.strerror})") from exc


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


@db_app.command("upgrade")
def upgrade(storage: StorageOpt = None) -> None:
    """Create or upgrade autotune's tables (Postgres needs this once; SQLite is automatic)."""
    with Store.open(_url(storage), upgrade=True) as store:
        print(f"database {store.url.split('@')[-1]} at revision {store.current_revision()}")
