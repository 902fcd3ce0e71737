"""``autotune study create`` and ``autotune study run``: a config checked and stored, and a
study run with its progress printed and its recommendation at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autotune import preflight, sizing
from autotune.cli._app import console, study_app
from autotune.cli.database import StorageOpt, open_store, study_store
from autotune.cli.progress import progress_printer
from autotune.config import MAX_TIMEOUT_S, MAX_TRIALS, parse_config, read_config_text, source_map
from autotune.errors import ConfigError, NotFoundError
from autotune.gitrecord.run_hooks import HOOKS
from autotune.inputs import MAX_CONFIG_BYTES
from autotune.report.best_output import format_recommendation
from autotune.report.lowload import below_lowest_load, lower_capacity_low_hint
from autotune.report.recommend import no_feasible_reason, recommend
from autotune.store import Store
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study, load_study_config
from autotune.tuning.run.lanes import parse_devices, plan_lanes
from autotune.tuning.run.status import study_plan
from autotune.tuning.run.stopping import Interrupted
from autotune.tuning.study_attrs import stored_noise
from autotune.workers.gpu_discovery import ALL, NoGpuError, find_gpus

__all__ = ["create", "run_cmd"]


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


_N_TRIALS_HELP = "at most N trials (N >= 1)"

GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="run trials in parallel on these devices, e.g. 0,1,2,3, or 'all' (the devices "
        "this host or pod was given); each trial gets its own share as CUDA_VISIBLE_DEVICES; "
        "overrides worker.gpus",
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


def _check_gpus(gpus: str | None, per_trial: int | None) -> str | None:
    """``--gpus`` as a device list (``all`` resolved to the devices found here,
    docs/scale-out.md#3-the-devices-of-a-pod); what the flags alone get wrong, as usage
    errors; what conflicts with the study's config is found when the run loads it
    (autotune.tuning.run.lanes.plan_lanes)."""
    if gpus is None:
        if per_trial is not None:
            raise typer.BadParameter("applies only with --gpus", param_hint="'--gpus-per-trial'")
        return None
    if gpus == ALL:
        try:
            found = find_gpus()
        except NoGpuError as exc:
            raise typer.BadParameter(f"all: {exc}", param_hint="'--gpus'") from None
        console().print(f"--gpus all: {escape(found.describe())}", highlight=False)
        gpus = ",".join(found.devices)
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
    return gpus


def _located(exc: ConfigError, text: str, source: str) -> ConfigError:
    """A create-time error raised from a config field (``exc.field``, e.g.
    ``("enqueue", 0, "max_model_len")``) with the file and line of that field prepended;
    any other error as it is."""
    if exc.field is None:
        return exc  # not a field's error (a path, a file:line already)
    where = source_map(text, source).where(exc.field)
    return ConfigError(f"{where}: {exc}", field=exc.field)


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
    gpus = _check_gpus(gpus, gpus_per_trial)
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
        for line in prof.get("notes", []):  # a search range that excludes the baseline
            console().print(f"note: {escape(line)}", highlight=False)
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
            hooks=HOOKS,  # optuna-dashboard's notes and plots, the git record
        )
    except Interrupted as exc:  # SIGTERM/SIGHUP: stopped as Ctrl-C stops a run
        what = "every running trial was" if gpus is not None else "the running trial was"
        print(f"{exc}: {what} failed and queued again", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    idle = f", {report.idle_s:,.0f} s idle" if report.idle_s >= 0.5 else ""
    console().print(f"{report.trials_run} trial(s) run ({report.stopped_by}{idle}).")
    cfg = load_study_config(store.get_study(name))  # type: ignore[arg-type]
    trials = store.trials(name)
    repeats = store.repeats(name)
    rec = recommend(cfg, trials, repeats, stored_noise(store, name))
    console().print(escape(study_cost(trials, repeats).text), highlight=False)
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
    gpus = _check_gpus(gpus, gpus_per_trial)
    with study_store(storage, name) as store:  # run_study names a missing study
        _run(store, name, n_trials, timeout, fail_running, gpus=gpus, gpus_per_trial=gpus_per_trial)
