"""The validation phase (docs/tuning.md#7-validation): after the search, re-measure the top
configs and the baseline on fresh workload samples with fresh jitter, store every run in
``autotune_repeats`` (never as Optuna trials, so trial counts and the dashboard stay the
search's), and publish the summary that :mod:`autotune.tuning.measure.interval` computes.

Every run is one unit of work: a stored row (PENDING, RUNNING, COMPLETE) that starts a worker,
measures one config on one repeat's workload sample with the trials' own protocol (the
capacity lattice search in slo-capacity mode, one level otherwise), and stops the worker. The
plan interleaves the configs: each repeat runs every config once, in an order rotated from
repeat to repeat, so that drift over time hits every config alike. A run cut short (Ctrl-C)
goes back to PENDING; the next ``study run`` runs what is pending.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from autotune.config import StudyConfig
from autotune.errors import StorageError, WorkerStartupError
from autotune.store import RepeatRecord, Store, TrialRecord
from autotune.tuning.measure.candidates import (
    candidates_of,
    measured_alike,
    start_of,
    told_apart,
)
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.interval import ValidationSummary, summary_of
from autotune.tuning.measure.level_plan import LevelPlan, Measured, measure
from autotune.tuning.measure.noise import NoiseRecord
from autotune.tuning.measure.runner_protocol import Runner
from autotune.tuning.measure.scoring import Slo, record_rank, worst_slo_margin
from autotune.tuning.run.events import (
    OnEvent,
    ValidationDone,
    ValidationRunDone,
    ValidationRunStart,
    ValidationStart,
)
from autotune.workload.build import sample_description, workload_sample
from autotune.workload.core import Workload

__all__ = [
    "ValidationOutcome",
    "candidates_of",
    "measure_run",
    "measured_alike",
    "plan_runs",
    "repeat_seeds",
    "run_validation",
    "single_run",
]

log = logging.getLogger(__name__)

# a runner for one validation run, given the run's jitter seed
RunnerFactory = Callable[[int], Runner]

_TAG = 0x76616C69  # "vali": keeps validation seeds apart from every other seed of a study
_MASK = 0xFFFFFFFF


@dataclass
class ValidationOutcome:
    runs: int  # runs this call made
    stopped_by: str | None  # "timeout" when the run's time ran out first
    summary: ValidationSummary | None  # None: validation off, or nothing to compare


# what a run's measurement sets on its record (the other fields say which run it is)
_RESULT_FIELDS = (
    "slo_held",
    "capacity_scale",
    "objective",
    "worst_margin",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "overlength_rate",
    "requests",
    "levels",
    "failure_class",
    "violations",
    # what its worker cost (docs/cost.md#1-what-is-counted)
    "worker_s",
    "worker_startup_s",
    "replayed_s",
    "devices_held",
    "cost_modelled",
)


def _measured(run: RepeatRecord, slo_held: bool, **figures: Any) -> RepeatRecord:
    """``run`` with one measurement's results: ``slo_held`` and ``figures``, the results not
    given at the store record's defaults (nothing measured)."""
    which = {
        f.name: getattr(run, f.name)
        for f in dataclasses.fields(RepeatRecord)
        if f.name not in _RESULT_FIELDS
    }
    return dataclasses.replace(RepeatRecord(**which), slo_held=slo_held, **figures)


def single_run(cfg: StudyConfig, engine_args: Mapping[str, Any]) -> RepeatRecord:
    """A validation run of ``engine_args`` outside the phase's plan, for a caller that draws
    its own workload sample and runner (the benchmarks' re-measurements)."""
    return RepeatRecord(
        study_name=cfg.name,
        repeat_index=0,
        position=0,
        trial_number=0,
        role="candidate",
        engine_args=dict(engine_args),
        sample="the caller's",
        workload_seed=cfg.workload.seed,
        jitter_seed=cfg.seed,
    )


def repeat_seeds(cfg: StudyConfig, repeat: int) -> tuple[int, int]:
    """(workload seed, jitter seed) of validation repeat ``repeat`` (0-based): fresh, and a
    function of the study's seeds alone, so every controller plans the same samples."""
    ss = np.random.SeedSequence([cfg.workload.seed & _MASK, cfg.seed & _MASK, _TAG, repeat])
    a, b = ss.generate_state(2)
    return int(a), int(b)


def plan_runs(
    cfg: StudyConfig, baseline: TrialRecord, candidates: Sequence[TrialRecord]
) -> list[RepeatRecord]:
    """Every run of the phase, interleaved: repeat r runs the configs rotated by r."""
    configs = [baseline, *candidates]
    k = len(configs)
    out = []
    for r in range(cfg.validation_repeats):
        ws, js = repeat_seeds(cfg, r)
        for pos in range(k):
            t = configs[(pos + r) % k]
            out.append(
                RepeatRecord(
                    study_name=t.study_name,
                    repeat_index=r,
                    position=pos,
                    trial_number=t.optuna_trial_number,
                    role="baseline" if t is baseline else "candidate",
                    engine_args=dict(t.engine_args),
                    sample=sample_description(cfg, ws),
                    workload_seed=ws,
                    jitter_seed=js,
                )
            )
    return out


async def measure_run(
    cfg: StudyConfig,
    runner: Runner,
    wl: Workload,
    run: RepeatRecord,
    name: str,
    hint: float | None = None,
) -> RepeatRecord:
    """``run`` (its config) measured on one workload sample with the trials' protocol, except
    that the over-length limit is left to the pooled judgement (docs/tuning.md#7-validation):
    the load search sees only the latency and error SLOs. Returns the run's record with the
    results. Never raises for a worker failure (the SLOs did not hold); stops the worker
    whatever happens. ``hint``: the load its search starts at (the config's capacity in the
    study, ``strategy.validate.from_capacity``); None: the lattice's ends."""
    plan = LevelPlan.of(cfg)
    slo = plan.slo
    plan = dataclasses.replace(plan, slo=dataclasses.replace(slo, max_overlength_rate=1.0))
    try:
        await runner.start(run.engine_args, name)
    except WorkerStartupError as exc:
        fc = str(exc.failure_class)
        await runner.stop()
        failed = _measured(run, False, failure_class=fc, violations=[f"worker failed: {fc}"])
        return _with_usage(failed, runner)
    try:
        measured = await measure(runner, wl, plan, hint=hint if plan.capacity else None)
        if plan.capacity:
            result = _capacity_run(run, runner, measured)
        else:
            level = measured.level
            dead, m, ls = level.death, level.outcome.metrics, level.score
            held = ls.feasible and dead is None
            result = _measured(
                run,
                held,
                capacity_scale=1.0 if held else None,
                objective=m.output_throughput,
                worst_margin=worst_slo_margin(m, slo) if cfg.mode == "fixed-rate" else None,
                p99_ttft_ms=m.p99_ttft_ms,
                p99_tpot_ms=m.p99_tpot_ms,
                overlength_rate=m.overlength_rate if m.total else None,
                requests=m.total,
                levels=len(measured.levels),
                failure_class=str(dead.failure_class) if dead is not None else None,
                violations=ls.texts,
            )
    finally:
        await runner.stop()
    return _with_usage(result, runner)


def _with_usage(run: RepeatRecord, runner: Runner) -> RepeatRecord:
    """``run`` with what its worker cost (docs/cost.md#1-what-is-counted)."""
    usage = runner.usage()
    return dataclasses.replace(run, **usage.fields()) if usage is not None else run


def _capacity_run(run: RepeatRecord, runner: Runner, measured: Measured) -> RepeatRecord:
    """The result of the lattice search on one sample under the loose SLOs (no over-length
    limit); the over-length rate is read off its first level that ran to its end (it does
    not depend on load)."""
    rate: tuple[float | None, int] = (None, 0)
    seen = [lv.outcome for lv in measured.levels]
    levels = measured.scores
    assert measured.capacity is not None
    res = measured.capacity
    # a level that replayed to its end: a stopped one counts only the requests it finished
    # (docs/tuning.md#10-early-stop-inside-a-level)
    full = [o for o in seen if o.stop is None] or seen
    if full and full[0].metrics.total:
        rate = (full[0].metrics.overlength_rate, full[0].metrics.total)
    dead = runner.failure()
    at = [
        lv
        for lv in levels
        if lv.feasible and res.scale is not None and math.isclose(lv.scale, res.scale, rel_tol=1e-9)
    ]
    if dead is None and at:
        return _measured(
            run,
            True,
            capacity_scale=res.scale,
            objective=at[0].output_throughput,
            overlength_rate=rate[0],
            requests=rate[1],
            levels=len(levels),
        )
    low = min(levels, key=lambda lv: lv.scale, default=None)
    return _measured(
        run,
        False,
        overlength_rate=rate[0],
        requests=rate[1],
        levels=len(levels),
        failure_class=str(dead.failure_class) if dead is not None else None,
        violations=low.texts if low is not None else [],
    )


def _plan(
    cfg: StudyConfig, store: Store, name: str, noise: NoiseRecord | None
) -> tuple[list[RepeatRecord], tuple[str, ...]]:
    """The phase's runs (planned now unless stored) and, when planned now, why runners-up
    were left out."""
    runs = store.repeats(name)
    if runs:
        return runs, ()
    slo = Slo.of(cfg.slo)
    base, cands = candidates_of(
        store.trials(name),
        cfg.strategy.validate_.top_k,
        lambda t: record_rank(cfg.mode, slo, t),
    )
    # a runner-up the study already told from the best is not re-measured (told_apart)
    step = 100.0 * cfg.strategy.capacity_resolution if cfg.mode == "slo-capacity" else None
    band = noise.band_pct if noise is not None else None
    apart = [c for c in cands[1:] if told_apart(cands[0], c, band, step)]
    cands = [c for c in cands if c not in apart]
    if base is None or not cands:
        return [], ()  # nothing to compare: the search's own answer stands
    try:
        store.add_repeats(plan_runs(cfg, base, cands))
    except StorageError:
        runs = store.repeats(name)
        if not runs:
            raise
        return runs, ()  # another controller of the study planned it first
    notes = tuple(
        f"trial {c.optuna_trial_number} ({_figure(c, step)} against trial "
        f"{cands[0].optuna_trial_number}'s {_figure(cands[0], step)}): the study told them "
        f"apart by more than the server's noise band ({band:.1f} %) plus one step"
        for c in apart
    )
    return store.repeats(name), notes


def _figure(t: TrialRecord, step: float | None) -> str:
    if step is not None and t.capacity_scale:
        return f"capacity x{t.capacity_scale:.3f}"
    return f"{t.objective or 0.0:,.1f}"


async def run_validation(
    cfg: StudyConfig,
    store: Store,
    name: str,
    *,
    make_runner: RunnerFactory,
    vocab_size: int,
    deadline: float | None = None,
    on_event: OnEvent | None = None,
    publish: Callable[[dict[str, Any]], None] | None = None,
    noise: NoiseRecord | None = None,
) -> ValidationOutcome:
    """Plan the phase (once per study), run its pending runs in order until done or
    ``deadline`` (``time.monotonic()``), and ``publish`` the summary once complete; its
    verdict weighs the gains against the server's ``noise`` when it was measured."""
    if not cfg.strategy.validate_.enabled:
        return ValidationOutcome(0, None, None)
    emit = on_event or (lambda _e: None)
    runs, apart = _plan(cfg, store, name, noise)
    if not runs:
        return ValidationOutcome(0, None, None)
    pending = [r for r in runs if r.state == "PENDING"]
    if pending:
        emit(ValidationStart(len(runs), len(pending), apart))
    sample: tuple[int, Workload] | None = None
    made, stopped = 0, None
    # where each config's runs start their search: its capacity in the study, moved as the
    # repeat's sample moved the configs measured on it before (start_of)
    capacity = {
        t.optuna_trial_number: t.capacity_scale for t in store.trials(name, with_levels=False)
    }
    start_at = cfg.strategy.validate_.from_capacity
    for rec in pending:
        assert rec.id is not None
        if deadline is not None and time.monotonic() >= deadline:
            stopped = "timeout"
            break
        if not store.claim_repeat(rec.id):
            continue  # another controller of the study runs this one (claimed exactly once)
        if sample is None or sample[0] != rec.workload_seed:
            sample = (
                rec.workload_seed,
                workload_sample(cfg, rec.workload_seed, vocab_size=vocab_size)[0],
            )
        emit(ValidationRunStart(rec.repeat_index, rec.trial_number))
        runner = make_runner(rec.jitter_seed)
        if isinstance(runner, HttpRunner):
            # the length guard protects the study's max_model_len sizing, which a fresh sample
            # does not redo (its text lengths are the approximate ones)
            runner.check_prepared = None
        try:
            res = await measure_run(
                cfg,
                runner,
                sample[1],
                rec,
                f"validate-{rec.repeat_index}-{rec.trial_number:04d}",
                hint=start_of(rec, capacity, store.repeats(name)) if start_at else None,
            )
        except BaseException:
            store.update_repeat(rec.id, state="PENDING", started_at=None)
            raise
        results = {k: getattr(res, k) for k in _RESULT_FIELDS}
        store.update_repeat(rec.id, state="COMPLETE", finished_at=datetime.now(UTC), **results)
        made += 1
        emit(
            ValidationRunDone(
                rec.repeat_index,
                rec.trial_number,
                rec.role,
                len(runs) - len(pending) + made,
                len(runs),
                res,
                cfg.mode,
            )
        )
    summary = summary_of(cfg, store.repeats(name), store.trials(name), noise)
    if summary is not None and summary.complete:
        if publish is not None:
            publish(summary.to_dict())
        emit(ValidationDone(summary))
    return ValidationOutcome(made, stopped, summary)
