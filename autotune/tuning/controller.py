"""The study controller: ``create`` builds the workload, the search space and the baseline
and stores them; ``run`` asks Optuna for trials stage by stage, runs them and tells the
results back. Optuna's RDB storage and autotune's tables share one database (SQLite by
default, Postgres in production), so many controllers can share a study and a run can be
resumed after Ctrl-C."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.config import StudyConfig, parse_config
from autotune.errors import ConfigError, NotFoundError, SimStartupError, StorageError
from autotune.profiles.hardware import HardwareProfile, get_hardware
from autotune.profiles.models import ModelProfile, get_model, load_model_config
from autotune.store import Store, StudyRecord
from autotune.tuning import attrs
from autotune.tuning.claims import Claimed, Done
from autotune.tuning.events import OnEvent, RunStart, TrialAbandoned, on_lane
from autotune.tuning.findings import trial_summary
from autotune.tuning.lanes import LanePlan, RunBudget, plan_lanes, run_lanes
from autotune.tuning.plan import (
    baseline_engine_args,
    build_bounds,
    estimate_peak_concurrency,
    longest_candidate_warning,
    screen_max_model_len,
)
from autotune.tuning.runners import VirtualRunner, capacity_search, make_runner
from autotune.tuning.scoring import CONSTRAINT_NAMES, Slo, record_rank
from autotune.tuning.session import ControllerSession
from autotune.tuning.space import (
    PARAM_ORDER,
    SpaceBounds,
)
from autotune.tuning.stopping import Interrupted, stop_on_signals
from autotune.tuning.strategy import planned_total
from autotune.tuning.trial import TrialOutcome, TrialSetup, lattice_of, run_trial
from autotune.tuning.validate import ValidationOutcome, run_validation
from autotune.workload.build import study_workload
from autotune.workload.core import Workload
from autotune.workload.traces import dropped_text

__all__ = [
    "RunHooks",
    "RunReport",
    "baseline_capacity",
    "config_yaml_of",
    "constraint_names",
    "create_study",
    "fail_running",
    "load_study_config",
    "model_of",
    "optuna_value",
    "run_study",
    "sampler_seed",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunHooks:
    """What a run calls beyond tuning: the CLI and the nightly pass optuna-dashboard's
    notes and plots (``autotune.report.dashboard.HOOKS``, docs/report.md#7-after-the-run),
    which sit in a layer above this one. ``trial_told`` runs before Optuna is told a
    trial's result, ``run_ended`` after a run that ran trials (with its seconds)."""

    trial_told: Callable[[optuna.Trial, TrialOutcome, StudyConfig], None]
    run_ended: Callable[[optuna.Study, StudyConfig, StudyRecord, Store, float], None]


@dataclass
class RunReport:
    trials_run: int
    stopped_by: str  # "plan complete" | "n_trials" | "timeout"
    idle_s: float = 0.0  # waiting for other controllers' trials (docs/faults.md)
    recovered: list[str] = field(default_factory=list)  # what the start-up recovery fixed
    retried: list[int] = field(default_factory=list)  # retries this run queued
    validation_runs: int = 0  # re-measurements made after the search (tuning/validate.py)


def model_of(cfg: StudyConfig) -> ModelProfile:
    """The study's model profile: its ``config.json`` when given, else the named profile."""
    if cfg.model.config_json:
        return load_model_config(cfg.model.config_json, name=cfg.model.name)
    return get_model(cfg.model.name)


def _enqueued_configs(
    cfg: StudyConfig, b: SpaceBounds, baseline: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """The baseline and the ``enqueue:`` configs, each checked against the search space
    before anything is stored: a tuned name, and for a parameter with choices (the
    ``max_model_len`` candidates, ``search.extra``) one of them; Optuna would refuse any
    other value only when the trial runs (docs/faults.md#7-enqueued-values)."""
    configs = [("baseline", baseline)]
    known = set(PARAM_ORDER) | {n for n, _ in b.extras}
    choices: dict[str, tuple[Any, ...]] = {
        "max_model_len": tuple(b.max_model_len_candidates),
        **dict(b.extras),
    }
    for i, entry in enumerate(cfg.enqueue):
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ConfigError(
                f"enqueue[{i}].{unknown[0]}: not a tuned parameter "
                f"(known: {', '.join(sorted(known))})"
            )
        for name, value in entry.items():
            allowed = choices.get(name)
            if allowed is not None and value not in allowed:
                raise ConfigError(
                    f"enqueue[{i}].{name}: {value!r} is not in the search space (this "
                    f"study's choices: {', '.join(repr(c) for c in allowed)})"
                )
        configs.append((f"enqueue-{i}", {**baseline, **entry}))
    return configs


def load_study_config(rec: StudyRecord) -> StudyConfig:
    return parse_config(rec.config_yaml, f"<stored config of study {rec.name!r}>")


def create_study(cfg: StudyConfig, config_yaml: str, store: Store) -> StudyRecord:
    """Validate everything that can be checked before a launch, then store the study."""
    model, hw = model_of(cfg), get_hardware(cfg.hardware)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    prof = wl.profile()
    cands_probe = build_bounds(cfg, model, prof, 0).max_model_len_candidates
    base_mml = max(cands_probe)
    baseline = baseline_engine_args(model, hw, base_mml)
    scale = 1.0
    if cfg.mode == "slo-capacity" and not cfg.workload.peak_concurrency:
        # Concurrency grows with the offered load: size max_num_seqs for the load the
        # baseline itself sustains within the SLOs (a quick sim-virtual capacity search).
        scale = asyncio.run(baseline_capacity(cfg, model, hw, wl, baseline))
    peak = cfg.workload.peak_concurrency or estimate_peak_concurrency(
        model, hw, wl, base_mml, scale
    )
    bounds = build_bounds(cfg, model, prof, peak)
    # Before any launch: candidates whose over-length rate on this workload breaks the limit
    # would fail at every load; they are dropped here, and none left is a config error.
    screening = screen_max_model_len(
        bounds.max_model_len_candidates,
        [r.prompt_len for r in wl.requests],
        [r.output_len for r in wl.requests],
        cfg.slo.max_overlength_rate,
    )
    # the baseline's max_model_len is the longest candidate: kept whenever any is
    bounds = replace(bounds, max_model_len_candidates=screening.kept)
    configs = _enqueued_configs(cfg, bounds, baseline)
    if store.get_study(cfg.name) is not None:
        raise StorageError(
            f"study {cfg.name!r} already exists; use `autotune study run "
            f"{cfg.name}` to continue it or `autotune study delete {cfg.name}`"
        )
    header = attrs.StudyHeader(bounds, baseline, prof.fingerprint, screening.to_dict())
    attrs.open_study(store.optuna_storage(), cfg.name, header, configs)
    profile = prof.to_dict() | {"estimated_peak_concurrency": peak}
    # what `study create` states before anything runs: rows of the file left out, and a
    # baseline max_model_len that a handful of requests set
    if wl.dropped:
        profile["dropped_rows"] = dropped_text(wl.dropped, len(wl))
    tail = (
        None
        if cfg.search.max_model_len.candidates  # the user's own candidates: their choice
        else longest_candidate_warning(
            screening.kept, [r.prompt_len for r in wl.requests], [r.output_len for r in wl.requests]
        )
    )
    if tail is not None:
        profile["warnings"] = [tail]
    rec = StudyRecord(
        name=cfg.name,
        config_yaml=config_yaml,
        workload_profile=profile,
        mode=cfg.mode,
        worker_kind=cfg.worker.kind,
        optuna_study_name=cfg.name,
    )
    rec.id = store.create_study(rec)
    return rec


async def baseline_capacity(
    cfg: StudyConfig,
    model: ModelProfile,
    hw: HardwareProfile,
    wl: Workload,
    baseline: Mapping[str, Any],
) -> float:
    """The load scale ``baseline`` sustains within the SLOs: a quick sim-virtual capacity
    search (1.0 when the simulator cannot start it)."""
    runner = VirtualRunner(
        model, hw, model_name=cfg.model.name, static_args={}, seed=cfg.seed, jitter_cv=0.0
    )
    try:
        await runner.start(baseline, "capacity-probe")
    except SimStartupError:
        return 1.0
    lattice = lattice_of(cfg)
    res, _ = await capacity_search(
        runner, wl, Slo.of(cfg.slo), lattice, max_levels=cfg.strategy.capacity_levels
    )
    return res.scale if res.scale is not None else lattice.low


def optuna_value(cfg: StudyConfig, out: TrialOutcome) -> float:
    """What the sampler maximises: the objective, except in ``fixed-rate`` mode, where
    every feasible trial serves the offered rate and the worst SLO margin's headroom ranks
    them (docs/tuning.md#9-the-fixed-rate-objective); an infeasible trial scores 0."""
    if cfg.mode != "fixed-rate":
        return out.score.objective
    if not out.score.feasible:
        return 0.0
    return record_rank(cfg.mode, Slo.of(cfg.slo), out.record)[0] or out.score.objective


def constraint_names(cfg: StudyConfig) -> list[str]:
    """The constraints every trial of ``cfg`` reports to Optuna."""
    return [*CONSTRAINT_NAMES, *(["preemptions"] if cfg.telemetry.preemption_constraint else [])]


def sampler_seed(seed: int, n_trials: int) -> int:
    """A fresh sampler's seed for the next trial: a hash of the study's seed and the trial
    count. (``seed + n`` would make seed 1's samples seed 0's shifted by one trial.)"""
    ss = np.random.SeedSequence([seed & 0xFFFFFFFF, n_trials])
    return int(ss.generate_state(1)[0])


def fail_running(study: optuna.Study, store: Store, name: str) -> None:
    """Mark every RUNNING trial FAIL and every RUNNING validation run PENDING. Only for what a
    killed controller left behind (Ctrl-C already does it for its own): other controllers
    sharing the study may be running theirs, so this is never done implicitly."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
    for tr in store.trials(name):
        if tr.state == "RUNNING" and tr.id is not None:
            store.update_trial(tr.id, state="FAIL")
    for rr in store.repeats(name):  # validation runs are units of work: run them again
        if rr.state == "RUNNING" and rr.id is not None:
            store.update_repeat(rr.id, state="PENDING", started_at=None)


async def _run(
    cfg: StudyConfig,
    store: Store,
    study: optuna.Study,
    bounds: SpaceBounds,
    wl: Workload,
    model: ModelProfile,
    hw: HardwareProfile,
    n_trials: int | None,
    timeout: float | None,
    on_event: OnEvent | None,
    workdir: Path,
    plan: LanePlan | None = None,
    hooks: RunHooks | None = None,
) -> RunReport:
    """This process as one of the study's controllers (registered, heartbeating, recovering
    what others left, docs/faults.md) running trials until the plan, ``n_trials`` or
    ``timeout`` ends the run, on each lane of ``plan`` at once (docs/parallel.md); SIGTERM
    and SIGHUP end it as Ctrl-C does."""
    session = ControllerSession(
        store,
        study,
        cfg,
        bounds,
        seed_for=lambda n: sampler_seed(cfg.seed, n),
        constraint_names=constraint_names(cfg),
    )
    ended, note = "failed", None
    try:
        recovered = session.open()
        with stop_on_signals() as stop:
            try:
                report = await _trials(
                    cfg,
                    store,
                    study,
                    bounds,
                    wl,
                    model,
                    hw,
                    n_trials,
                    timeout,
                    on_event,
                    workdir,
                    session,
                    recovered,
                    stop.signum_now,
                    plan,
                    hooks,
                )
            except asyncio.CancelledError:
                if stop.signum is not None:
                    ended, note = "interrupted", signal.Signals(stop.signum).name
                    raise Interrupted(stop.signum) from None
                raise
        ended = "stopped"
        return report
    except KeyboardInterrupt:
        ended, note = "interrupted", note or "interrupted"
        raise
    except BaseException as exc:
        note = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        session.close(ended, note)


async def _trials(
    cfg: StudyConfig,
    store: Store,
    study: optuna.Study,
    bounds: SpaceBounds,
    wl: Workload,
    model: ModelProfile,
    hw: HardwareProfile,
    n_trials: int | None,
    timeout: float | None,
    on_event: OnEvent | None,
    workdir: Path,
    session: ControllerSession,
    recovered: list[str],
    stop_signal: Callable[[], int | None],
    plan: LanePlan | None = None,
    hooks: RunHooks | None = None,
) -> RunReport:
    if timeout is None:
        timeout = cfg.strategy.timeout_s  # the config's default limit for a run
    budget = RunBudget(n_trials, timeout)  # the clock starts now
    first = study.get_trials(deepcopy=False)
    planned = planned_total(cfg.strategy, bounds, 1 + len(cfg.enqueue), first)
    if on_event is not None:
        on_event(
            RunStart(
                planned,
                sum(1 for t in first if t.state == TrialState.COMPLETE),
                timeout,
                tuple(recovered),  # what dead runs left, and how it was fixed
                tuple(",".join(d) for d in plan.lanes) if plan is not None else None,
            )
        )
    assert session.claims is not None and session.recovery is not None
    claims, retried = session.claims, session.recovery.retried
    halted: list[str] = []  # why the other lanes stopped, once one lane failed

    async def lane(index: int) -> str:
        """Claim and run trials one after another until the run ends (one lane)."""
        setups: dict[str | None, TrialSetup] = {}

        def setup_for(engine_args: Mapping[str, Any]) -> TrialSetup:
            # the lane's devices, or worker.gpus when the run has no --gpus (which the
            # in-process simulator never sees)
            devices = (
                plan.devices_for(index, {**cfg.worker.static_args, **engine_args})
                if plan is not None
                else cfg.worker.gpus
                if cfg.worker.kind != "sim-virtual"
                else None
            )
            if devices not in setups:
                runner = make_runner(cfg, model, hw, workdir, registry=session, gpus=devices)
                emit = on_event if plan is None else on_lane(on_event, index, devices)
                setups[devices] = TrialSetup(
                    cfg, runner, wl, store, cfg.name, emit, devices=devices
                )
            return setups[devices]

        while True:
            if (why := budget.reserve()) is not None:
                return why
            # the next trial, claimed exactly once among every lane of every controller of
            # the study; or wait while others run the rest of the current stage
            got = claims.next(index)
            if not isinstance(got, Claimed):
                budget.release()
                if isinstance(got, Done):
                    return "plan complete"
                await session.idle(got, on_event, index)
                continue
            session.claimed(got)
            trial, stage_name, engine_args = got.trial, got.stage, got.engine_args
            setup = setup_for(engine_args)
            attrs.write_trial_start(study, trial, stage_name, engine_args, cfg.mode)
            attrs.write_devices(trial, setup.devices)  # or a retry's copy of none
            frozen = store.optuna_storage().get_trial(attrs.trial_id(trial))
            # No capacity hint: every trial gets the same search as the baseline. Under noise
            # a search started at the best capacity so far finds lucky feasible points up
            # there that a search from the ends never visits
            # (docs/tuning.md#1-the-capacity-lattice).
            try:
                out = await run_trial(
                    setup,
                    number=trial.number,
                    stage=stage_name,
                    params=trial.params,
                    engine_args=engine_args,
                    # trial numbers are Optuna's (0-based) everywhere; the position counts
                    # complete trials, so a resumed run never reads "trial 7 of 6"
                    # the plan's size as of now: the baseline's diagnosis resizes it
                    position=(
                        got.complete_before + 1,
                        planned_total(
                            cfg.strategy,
                            bounds,
                            1 + len(cfg.enqueue),
                            study.get_trials(deepcopy=False),
                        ),
                    ),
                    first_attempt=not attrs.retry_history(frozen),
                )
            except BaseException as exc:
                # failed in both stores and queued again, once (docs/faults.md)
                why_failed = halted[0] if halted else _why_stopped(exc, stop_signal())
                line = claims.abandon(got, why_failed)
                session.released(got)
                if line and setup.on_event is not None:
                    setup.on_event(TrialAbandoned(trial.number, line))
                raise
            if out.retry is not None:
                # its worker was killed from outside or hung: this attempt is no verdict; it
                # is failed and the configuration runs again once in a fresh worker
                # (docs/faults.md#10-worker-faults)
                attrs.write_failure_class(trial, out.failure_class)
                line = claims.abandon(got, out.retry)
                session.released(got)
                budget.release()
                if line and setup.on_event is not None:
                    setup.on_event(TrialAbandoned(trial.number, line))
                continue
            # constraints and attributes, then the trial's note (docs/report.md)
            attrs.write_trial_summary(study, trial, trial_summary(out, cfg), out.score.constraints)
            if hooks is not None:
                hooks.trial_told(trial, out, cfg)
            study.tell(trial, optuna_value(cfg, out))
            claims.finish(got)
            session.released(got)
            budget.finished()

    if plan is None or len(plan.lanes) == 1:
        stopped = [await lane(0)]
    else:

        def halt(exc: BaseException) -> None:
            halted.append(_why_stopped(exc, stop_signal()))

        bodies = [functools.partial(lane, i) for i in range(len(plan.lanes))]
        stopped = await run_lanes(bodies, halt)
    # a lane that found the plan complete speaks for the run; else the first limit reached
    stopped_by = next((w for w in ("plan complete", "timeout") if w in stopped), stopped[0])
    runs = 0
    if stopped_by == "plan complete":
        # the search is over: re-measure its top configs within the same time limit, one
        # run at a time on the first lane's devices (docs/tuning.md#7-validation)
        gpus = ",".join(plan.lanes[0]) if plan is not None else cfg.worker.gpus
        v = await _validate(
            cfg, store, study, model, hw, workdir, on_event, budget.t0, timeout, session, gpus
        )
        stopped_by, runs = v.stopped_by or stopped_by, v.runs
    return RunReport(budget.ran, stopped_by, session.idle_s, recovered, list(retried), runs)


def _why_stopped(exc: BaseException, signum: int | None) -> str:
    if signum is not None:
        return f"the run was stopped by {signal.Signals(signum).name}"
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return "the run was interrupted"
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"the run failed ({type(exc).__name__}: {first})"


async def _validate(
    cfg: StudyConfig,
    store: Store,
    study: optuna.Study,
    model: ModelProfile,
    hw: HardwareProfile,
    workdir: Path,
    on_event: OnEvent | None,
    t0: float,
    timeout: float | None,
    session: ControllerSession,
    gpus: str | None,
) -> ValidationOutcome:
    """The validation phase (docs/tuning.md#7-validation): its runs are stored in autotune's
    table, its summary is a study attribute for the dashboard."""
    return await run_validation(
        cfg,
        store,
        cfg.name,
        make_runner=lambda seed: make_runner(
            cfg.model_copy(update={"seed": seed}),
            model,
            hw,
            workdir,
            registry=session,
            gpus=gpus if cfg.worker.kind != "sim-virtual" else None,
        ),
        vocab_size=model.vocab_size,
        deadline=None if timeout is None else t0 + timeout,
        on_event=on_event,
        publish=lambda summary: attrs.write_validation(study, summary),
    )


def run_study(
    name: str,
    store: Store,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    on_event: OnEvent | None = None,
    workdir: Path | None = None,
    reset_running: bool = False,
    gpus: str | None = None,
    gpus_per_trial: int | None = None,
    hooks: RunHooks | None = None,
) -> RunReport:
    """Run (or resume) the study ``name``. ``gpus`` (``--gpus``): run trials in parallel,
    ``gpus_per_trial`` devices each (docs/parallel.md); it overrides ``worker.gpus``.
    ``hooks``: optuna-dashboard's notes and plots (``autotune.report.dashboard.HOOKS``)."""
    rec = store.get_study(name)
    if rec is None:
        raise NotFoundError(
            f"no study named {name!r} in {store.url.split('@')[-1]}; "
            "create it with `autotune study create --config FILE`"
        )
    cfg = load_study_config(rec)
    if gpus is None and gpus_per_trial is not None:
        raise ConfigError("--gpus-per-trial applies only with --gpus")
    plan = plan_lanes(gpus, gpus_per_trial, cfg) if gpus is not None else None
    if plan is not None and len(plan.lanes) > 1 and cfg.worker.kind == "sim-virtual":
        log.warning(
            "worker.kind sim-virtual simulates in this process: its %d lanes take turns "
            "(docs/parallel.md#6-the-in-process-simulator)",
            len(plan.lanes),
        )
    model, hw = model_of(cfg), get_hardware(cfg.hardware)
    study = optuna.load_study(study_name=rec.optuna_study_name, storage=store.optuna_storage())
    header = attrs.read_header(study)
    bounds, stored = header.bounds, header.workload_fingerprint
    wl = study_workload(cfg, vocab_size=model.vocab_size, expect_fingerprint=stored)
    if wl.fingerprint() != stored:
        raise ConfigError(
            f"study {name!r}: the workload no longer matches the one the study "
            "was created with (its file changed?); create a new study"
        )
    if reset_running:
        fail_running(study, store, name)
    work = workdir or Path(cfg.worker.workdir) / name
    t0 = time.monotonic()
    report = asyncio.run(
        _run(
            cfg, store, study, bounds, wl, model, hw, n_trials, timeout, on_event, work, plan, hooks
        )
    )
    if report.trials_run and hooks is not None:  # the dashboard's note and plots, as of now
        hooks.run_ended(study, cfg, rec, store, time.monotonic() - t0)
    return report


def config_yaml_of(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
