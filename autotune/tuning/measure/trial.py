"""One trial: start the worker with the suggested engine args, replay the load levels the
mode asks for, score, and store everything (launch command, per-level results, failure
class). Worker failures are COMPLETE trials with objective 0 and positive violations, except a
first attempt's death that was not the configuration's doing (``KILLED``, ``HUNG``,
autotune/workers/cause.py): that attempt is stored FAIL and the configuration runs again in a
fresh worker (docs/faults.md#10-worker-faults)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import ServiceError, WorkerStartupError
from autotune.failures import FailureClass
from autotune.loadgen.request_log import encode_requests
from autotune.loadgen.sender import ProgressSnapshot
from autotune.store import Store, TrialRecord
from autotune.tuning.attrs import constraint_names, constraint_order
from autotune.tuning.measure.inferred import Inferred
from autotune.tuning.measure.level_plan import (
    LevelPlan,
    Measured,
    MeasuredLevel,
    SettleBar,
    measure,
)
from autotune.tuning.measure.noise import NoiseRecord, measure_noise
from autotune.tuning.measure.outcome import LevelOutcome, level_record
from autotune.tuning.measure.runner_protocol import Runner
from autotune.tuning.measure.scoring import (
    TrialScore,
    failed_trial_score,
    score_trial,
)
from autotune.tuning.run.events import (
    LevelDone,
    LevelProgress,
    LevelStart,
    OnEvent,
    TrialDone,
    TrialInferred,
    TrialStart,
    WorkerDied,
    WorkerFailed,
)
from autotune.workers.cause import RETRYABLE
from autotune.workload.core import Workload

__all__ = ["TrialOutcome", "TrialSetup", "level_record", "run_trial"]

log = logging.getLogger(__name__)


@dataclass
class TrialSetup:
    cfg: StudyConfig
    runner: Runner
    workload: Workload
    store: Store
    study_name: str
    on_event: OnEvent | None = None
    # slo-capacity: a lattice point to start the search from. None (what studies use): the
    # canonical search from the lattice's ends, the same for every trial
    # (docs/tuning.md#1-the-capacity-lattice).
    capacity_hint: float | None = None
    # the CUDA_VISIBLE_DEVICES its worker gets, stored on the trial (docs/parallel.md)
    devices: str | None = None

    @functools.cached_property
    def plan(self) -> LevelPlan:
        """How each level is measured and judged (derived from ``cfg`` once)."""
        return LevelPlan.of(self.cfg)


@dataclass
class TrialOutcome:
    score: TrialScore
    record: TrialRecord
    failure_class: str | None
    # set when this attempt ended FAIL for a death that was not the configuration's doing:
    # why, for the retry's line; the caller queues the configuration again
    retry: str | None = None
    # the server's noise, when the caller asked for it (the baseline, once per study)
    noise: NoiseRecord | None = None
    # the levels as measured (or inferred), for a later trial to stand on
    # (autotune/tuning/measure/inferred.py); () when the worker failed
    levels: tuple[MeasuredLevel, ...] = ()


def _level_sink(
    setup: TrialSetup, rec: TrialRecord, number: int
) -> tuple[Callable[[float], Callable[[ProgressSnapshot], None]], Callable[[MeasuredLevel], None]]:
    """The callbacks that store each level (in ``rec.levels``) and emit its events: one
    called as a level starts, one as it is scored."""
    store = setup.store
    emit = setup.on_event or (lambda _e: None)
    assert rec.id is not None
    rec_id = rec.id

    def start(scale: float) -> Callable[[ProgressSnapshot], None]:
        emit(LevelStart(number, scale))

        def live(p: ProgressSnapshot, n: int = number, sc: float = scale) -> None:
            emit(LevelProgress(n, sc, p.sent, p.planned, p.completed, p.failed, p.p99_ttft_ms))

        return live

    def done(level: MeasuredLevel) -> None:
        out, ls, dead = level.outcome, level.score, level.death
        lvl = level_record(level.index, out, ls)
        if dead is not None:  # the worker died under load (OOM, engine crash)
            failure = str(dead.failure_class)
            # keep what the level measured before the death, flagged partial (never
            # feasible), with the cause, exit code or signal and log context
            lvl.feasible = False
            lvl.id = store.add_level(rec_id, lvl)
            _keep_requests(setup, lvl.id, out)
            rec.levels.append(lvl)
            what = "hung" if failure == FailureClass.HUNG else "died"
            head = f"worker {what}: {dead.line}"[:2000]
            context = out.death.log_context if out.death is not None else ""
            tail = f"{head}\n{context[-(7999 - len(head)) :]}"
            store.update_trial(rec_id, failure_class=failure, log_tail=tail)
            rec.log_tail = tail
            emit(WorkerDied(number, ls.scale, failure, dead.line))
            return
        lvl.id = store.add_level(rec_id, lvl)
        _keep_requests(setup, lvl.id, out)
        rec.levels.append(lvl)
        emit(LevelDone(number, ls.scale, out.offered_rate, ls.feasible, out.metrics, ls.texts))

    return start, done


async def _replay(
    setup: TrialSetup, rec: TrialRecord, number: int, settle: SettleBar | None
) -> tuple[Measured | None, str | None]:
    """Measure the started worker in the study's mode (:func:`measure`), storing each level
    (in ``rec.levels``) and emitting its events. Returns the measurement and the failure
    class if the worker died."""
    start, done = _level_sink(setup, rec, number)
    measured = await measure(
        setup.runner,
        setup.workload,
        setup.plan,
        hint=setup.capacity_hint,
        settle=settle,
        on_start=start,
        on_level=done,
    )
    dead = measured.death
    return measured, str(dead.failure_class) if dead is not None else None


async def run_trial(
    setup: TrialSetup,
    *,
    number: int,
    stage: str,
    params: Mapping[str, Any],
    engine_args: Mapping[str, Any],
    position: tuple[int, int] | None = None,
    first_attempt: bool = False,
    noise: bool = False,
    settle: SettleBar | None = None,
    inferred: Inferred | None = None,
) -> TrialOutcome:
    """Run one configuration end to end. Never raises for a worker failure; re-raises
    cancellation after stopping the worker and marking the stored trial FAIL.
    ``first_attempt``: the configuration has not run before, so a death from outside
    (``KILLED``, ``HUNG``) ends this attempt FAIL with :attr:`TrialOutcome.retry` set
    instead of being its verdict. ``noise``: after the search, replay its boundary level
    twice more on the same worker (the server's noise, docs/tuning.md#7-validation).
    ``settle``: measure the best capacity so far first and stop there if it fails
    (docs/tuning.md#14-settling-losing-trials); the trial ends PRUNED, its capacity bounded.
    ``inferred``: the trial's levels, read off a measured twin (``inferred.py``): no worker
    starts, the levels are stored and scored as measured ones are."""
    cfg, runner, store = setup.cfg, setup.runner, setup.store
    noise_rec: NoiseRecord | None = None
    emit = setup.on_event or (lambda _e: None)
    rec = TrialRecord(
        study_name=setup.study_name,
        optuna_trial_number=number,
        stage=stage,
        state="RUNNING",
        params=dict(params),
        engine_args=dict(engine_args),
        launch_command=None,
        launch_argv=None,
        worker_kind=runner.kind,
        started_at=datetime.now(UTC),
        devices=setup.devices,
    )
    rec.id = store.add_trial(rec)
    emit(TrialStart(number, stage, dict(engine_args), position))
    failure: str | None = None
    measured: Measured | None = None
    if inferred is not None:
        measured = _take_inferred(setup, rec, number, inferred)
    else:
        measured, failure, noise_rec = await _on_worker(
            setup, rec, number, engine_args, noise=noise, settle=settle
        )
    names = constraint_names(cfg)
    if first_attempt and failure in RETRYABLE:
        return _attempt_failed(store, rec, failure, names)
    levels = measured.scores if measured is not None else []
    capacity = measured.capacity if failure is None and measured is not None else None
    score = failed_trial_score(names) if failure is not None else score_trial(levels, capacity)
    if failure is None and not levels:
        failure = str(FailureClass.UNKNOWN)
    below = score.settled_below if failure is None else None
    rec.state, rec.objective = (
        ("PRUNED", None) if below is not None else ("COMPLETE", score.objective)
    )
    rec.constraints = [score.constraints[k] for k in constraint_order(list(score.constraints))]
    # a settled trial is bounded, neither feasible nor infeasible
    rec.feasible = None if below is not None else score.feasible
    rec.capacity_scale = score.capacity_scale
    if below is not None and settle is not None:
        rec.settled_below, rec.settled_against = below, settle.against
    rec.failure_class = failure
    rec.finished_at = datetime.now(UTC)
    # the bottleneck that stops this config from taking more load
    top = rec.headline_level()
    if top is not None:
        rec.diagnosis = top.diagnosis
    store.update_trial(
        rec.id,
        state=rec.state,
        objective=rec.objective,
        constraints=rec.constraints,
        feasible=rec.feasible,
        capacity_scale=score.capacity_scale,
        failure_class=failure,
        diagnosis=rec.diagnosis,
        finished_at=rec.finished_at,
        settled_below=rec.settled_below,
        settled_against=rec.settled_against,
    )
    emit(
        TrialDone(
            number,
            stage,
            score.objective,
            score.feasible,
            failure,
            score.capacity_scale,
            capacity.status if capacity is not None else None,
            score.constraints,
            cfg.mode,
            rec,
        )
    )
    kept = measured.levels if measured is not None and failure is None else ()
    return TrialOutcome(score, rec, failure, noise=noise_rec, levels=kept)


def _take_inferred(
    setup: TrialSetup, rec: TrialRecord, number: int, inferred: Inferred
) -> Measured:
    """Store an inferred trial's levels as a measured trial's are, with the twin they were
    read from; no worker starts, so nothing is charged (docs/cost.md#1-what-is-counted)."""
    assert rec.id is not None
    rec.inferred_from = inferred.twin
    setup.store.update_trial(rec.id, inferred_from=inferred.twin)
    if setup.on_event is not None:
        setup.on_event(TrialInferred(number, inferred.line()))
    start, done = _level_sink(setup, rec, number)
    for level in inferred.measured.levels:
        start(level.outcome.scale)
        done(level)
    return inferred.measured


async def _on_worker(
    setup: TrialSetup,
    rec: TrialRecord,
    number: int,
    engine_args: Mapping[str, Any],
    *,
    noise: bool,
    settle: SettleBar | None,
) -> tuple[Measured | None, str | None, NoiseRecord | None]:
    """Start the trial's worker, measure it (and the server's noise when asked), stop it and
    store what it cost. Returns the measurement, the failure class and the noise record."""
    runner, store = setup.runner, setup.store
    assert rec.id is not None
    emit = setup.on_event or (lambda _e: None)
    failure: str | None = None
    measured: Measured | None = None
    noise_rec: NoiseRecord | None = None
    try:
        try:
            info = await runner.start(engine_args, f"trial-{number:04d}")
        except WorkerStartupError as exc:
            failure = str(exc.failure_class)
            tail = getattr(exc, "log_tail", None) or str(exc)
            # what start-up established before the failure (/health answered, then the
            # smoke request failed): startup time and KV capacity
            known = {
                k: getattr(exc, k)
                for k in ("startup_s", "kv_cache_tokens", "max_concurrency")
                if getattr(exc, k, None) is not None
            }
            store.update_trial(rec.id, failure_class=failure, log_tail=tail[-8000:], **known)
            rec.failure_class, rec.log_tail = failure, tail[-8000:]
            for k, v in known.items():
                setattr(rec, k, v)
            emit(WorkerFailed(number, failure, str(exc).splitlines()[0][:300]))
        else:
            rec.launch_command, rec.launch_argv = info.command, list(info.argv)
            rec.startup_s, rec.kv_cache_tokens = info.startup_s, info.kv_cache_tokens
            rec.max_concurrency = info.max_concurrency
            store.update_trial(
                rec.id,
                launch_command=info.command,
                launch_argv=list(info.argv),
                startup_s=info.startup_s,
                kv_cache_tokens=info.kv_cache_tokens,
                max_concurrency=info.max_concurrency,
            )
            measured, failure = await _replay(setup, rec, number, settle)
            if noise and measured is not None and failure is None:
                noise_rec = await measure_noise(
                    runner, setup.workload, setup.plan, measured, trial=number
                )
    except BaseException:
        # when the database is what failed, the error that says so is the one to keep: the
        # row is reconciled by the next start (docs/faults.md#4-database-outages)
        with contextlib.suppress(ServiceError):
            store.update_trial(rec.id, state="FAIL", finished_at=datetime.now(UTC))
        raise
    finally:
        await runner.stop()
        _store_usage(store, rec, runner)
    return measured, failure, noise_rec


def _keep_requests(setup: TrialSetup, level_id: int, out: LevelOutcome) -> None:
    """Store a stored level's per-request records when the study keeps them
    (``record.requests``, docs/loadgen.md#6-per-request-records), then let them go: the
    trial holds its levels' outcomes until it ends."""
    if setup.cfg.record.requests:
        setup.store.add_requests(level_id, encode_requests(out.requests))
    out.requests = ()


def _store_usage(store: Store, rec: TrialRecord, runner: Runner) -> None:
    """Store what the trial's worker cost (docs/cost.md#1-what-is-counted), also when the
    trial was interrupted: its device time was spent all the same."""
    usage = runner.usage()
    if usage is None or rec.id is None:
        return
    for k, v in usage.fields().items():
        setattr(rec, k, v)
    with contextlib.suppress(ServiceError):  # the database's own error is raised elsewhere
        store.update_trial(rec.id, **usage.fields())


def _attempt_failed(store: Store, rec: TrialRecord, failure: str, names: list[str]) -> TrialOutcome:
    """Store a first attempt that a death from outside ended: FAIL, its class, and a first
    line saying that it is no verdict; the levels it measured stay with it."""
    assert rec.id is not None
    why = {
        FailureClass.KILLED: "the worker was killed by a signal from outside",
        FailureClass.HUNG: "the worker hung",
    }.get(FailureClass(failure), failure)
    note = f"attempt failed ({failure}): {why}; not the configuration's doing, run again once"
    rec.state, rec.failure_class = "FAIL", failure
    rec.log_tail = f"{note}\n{rec.log_tail or ''}"[:8000]
    rec.finished_at = datetime.now(UTC)
    store.update_trial(
        rec.id,
        state="FAIL",
        failure_class=failure,
        log_tail=rec.log_tail,
        finished_at=rec.finished_at,
    )
    return TrialOutcome(failed_trial_score(names), rec, failure, retry=f"{why} ({failure})")
