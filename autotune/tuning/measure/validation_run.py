"""One validation run (docs/tuning.md#7-validation): a config measured on one workload sample
with the trials' own protocol (the capacity lattice search in slo-capacity mode, one level
otherwise), on a worker it starts or one the run before kept for it, and the record of what
it measured and what its worker cost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import WorkerStartupError
from autotune.store import RepeatRecord, WorkerUsage
from autotune.tuning.measure.level_plan import LevelPlan, Measured, measure
from autotune.tuning.measure.runner_protocol import Keepable, Runner
from autotune.tuning.measure.scoring import worst_slo_margin
from autotune.tuning.measure.validation_plan import RUN_STEPS
from autotune.workload.core import Workload

__all__ = ["CLIMB", "RESULT_FIELDS", "measure_block_run", "measure_run", "single_run"]

# A run's first step up from a held start (docs/tuning.md#7-validation, "Where a run
# starts"): a fresh sample moves a capacity by several lattice points either way, and a held
# level replays to its end where a failed one stops early, so the search overshoots upwards
# (3, then 6, 12, ... points) rather than climbing one held point at a time. A start whose
# latency headroom was measured steps by that instead (docs/tuning.md#1-the-capacity-lattice,
# "The first step up"), so this is the step only where no headroom was measured.
CLIMB = 3

# what a run's measurement sets on its record (the other fields say which run it is)
RESULT_FIELDS = (
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
        if f.name not in RESULT_FIELDS
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


async def measure_run(
    cfg: StudyConfig,
    runner: Runner,
    wl: Workload,
    run: RepeatRecord,
    name: str,
    hint: float | None = None,
    *,
    started: bool = False,
    keep: bool = False,
    stride: int = RUN_STEPS,
) -> RepeatRecord:
    """``run`` (its config) measured on one workload sample with the trials' protocol, except
    that the over-length limit is left to the pooled judgement (docs/tuning.md#7-validation):
    the load search sees only the latency and error SLOs. Returns the run's record with the
    results. Never raises for a worker failure (the SLOs did not hold); stops the worker
    whatever happens. ``hint``: the load its search starts at (the config's capacity in the
    study, ``strategy.validate.from_capacity``); None: the lattice's ends. ``started``: the
    runner's worker already serves this config (kept from the run before); ``keep``: leave
    it running for the next run of the block when it is healthy and can
    (docs/tuning.md#7-validation, "One worker for a block of runs"), this run charged its
    cost so far. ``stride``: the search steps over every ``stride``-th point of the study's
    lattice (the phase's run lattice; 1: the study's own, for a benchmark's re-measurement)."""
    return (await measure_block_run(cfg, runner, wl, run, name, hint, started, keep, stride))[0]


async def measure_block_run(
    cfg: StudyConfig,
    runner: Runner,
    wl: Workload,
    run: RepeatRecord,
    name: str,
    hint: float | None,
    started: bool,
    keep: bool,
    stride: int = RUN_STEPS,
) -> tuple[RepeatRecord, bool]:
    """:func:`measure_run`, and whether the worker was kept running."""
    plan = LevelPlan.of(cfg, stride=stride)
    slo = plan.slo
    plan = dataclasses.replace(plan, slo=dataclasses.replace(slo, max_overlength_rate=1.0))
    if not started:
        try:
            await runner.start(run.engine_args, name)
        except WorkerStartupError as exc:
            fc = str(exc.failure_class)
            await runner.stop()
            failed = _measured(run, False, failure_class=fc, violations=[f"worker failed: {fc}"])
            return _with_usage(failed, runner), False
    split: WorkerUsage | None = None
    try:
        measured = await measure(
            runner, wl, plan, hint=hint if plan.capacity else None, climb=CLIMB
        )
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
        if keep and isinstance(runner, Keepable) and runner.failure() is None:
            split = runner.split_usage()
    finally:
        if split is None:
            await runner.stop()
    return _with_usage(result, runner, split), split is not None


def _with_usage(
    run: RepeatRecord, runner: Runner, split: WorkerUsage | None = None
) -> RepeatRecord:
    """``run`` with what its worker cost (docs/cost.md#1-what-is-counted): ``split``, its
    part of a worker the next run keeps, else the stopped worker's (rest of its) cost."""
    usage = split if split is not None else runner.usage()
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
