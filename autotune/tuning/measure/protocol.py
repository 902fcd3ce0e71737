"""Measure one configuration outside a study, in-process, with the trials' own protocol or a
stricter one (docs/tuning.md#5-re-measurement-and-ground-truth).

``GROUND_TRUTH`` is the protocol the tuning-quality benchmark scores recommendations with:
the simulator's jitter off, capacity resolution 0.5 %, no hint, the study's workload sample.
Its resolution is exactly half a default step, ``sqrt(1.01) - 1`` (0.4988 %), so every point of
a study's default 1 % lattice is also a ground-truth point: the two protocols' lattices do not
drift apart, and the only rounding between them is half a study step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import SimStartupError
from autotune.profiles.hardware import HardwareProfile
from autotune.sim import hardware_of
from autotune.tuning.measure.capacity import CapacityResult
from autotune.tuning.measure.level_plan import LevelPlan, measure
from autotune.tuning.measure.per_device import PerDevice
from autotune.tuning.measure.runner_protocol import Runner, offered_rate
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.search.plan import model_of
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

__all__ = ["GROUND_TRUTH", "Measurement", "Protocol", "measure_config", "study_protocol"]


@dataclass(frozen=True)
class Protocol:
    resolution: float
    jitter_cv: float
    max_levels: int = 40


GROUND_TRUTH = Protocol(resolution=math.sqrt(1.01) - 1.0, jitter_cv=0.0)


def study_protocol(cfg: StudyConfig) -> Protocol:
    """The protocol a study's own trials use."""
    return Protocol(cfg.strategy.capacity_resolution, cfg.worker.jitter_cv)


@dataclass(frozen=True)
class Measurement:
    objective: float  # output tok/s at capacity (0: nothing feasible, or the worker failed)
    capacity_scale: float | None
    capacity_rps: float | None
    capacity: CapacityResult | None
    levels: int
    failure: str | None = None


async def measure_config(
    cfg: StudyConfig,
    engine_args: Mapping[str, Any],
    protocol: Protocol = GROUND_TRUTH,
    *,
    workload: Workload | None = None,
    seed: int | None = None,
    hint: float | None = None,
    hardware: HardwareProfile | None = None,
) -> Measurement:
    """Output tok/s at the capacity of ``engine_args`` on the study's simulated GPU, or on
    ``hardware`` (the twin strategy's calibrated profile) when given (slo-capacity: the
    lattice search, without a hint unless given; other modes: one level at 1.0x)."""
    model = model_of(cfg)
    hw = hardware if hardware is not None else hardware_of(cfg.hardware)
    wl = workload or build_workload(cfg.workload, vocab_size=model.vocab_size)
    plan = LevelPlan.of(cfg, resolution=protocol.resolution, max_levels=protocol.max_levels)
    # bisection at the middle, not a study's lean: a re-measurement spends no GPU time, and
    # the cached figures were measured so (docs/tuning.md#1-the-capacity-lattice)
    plan = dataclasses.replace(plan, lean=0.5)
    virtual = VirtualRunner(
        model,
        hw,
        model_name=cfg.model.name,
        static_args=cfg.worker.static_args,
        seed=cfg.seed if seed is None else seed,
        jitter_cv=protocol.jitter_cv,
        warmup=cfg.workload.warmup,
        early_stop=plan.early_stop,  # verdicts, and so capacities, are those of full replays
    )
    # a study that searches the parallelism measures per device, and so does its re-measure
    # (docs/tuning.md#16-the-parallelism-stage)
    runner: Runner = (
        PerDevice(virtual, cfg.worker.static_args)
        if cfg.search.parallelism is not None
        else virtual
    )
    try:
        await runner.start(engine_args, "measure")
    except SimStartupError as exc:
        return Measurement(0.0, None, None, None, 0, str(exc.failure_class))
    try:
        measured = await measure(runner, wl, plan, hint=hint)
    finally:
        await runner.stop()
    res = measured.capacity
    if res is None:  # one level at 1.0x
        level = measured.level
        ls = level.score
        obj = ls.output_throughput if ls.feasible else 0.0
        n = len(measured.levels)
        return Measurement(obj, 1.0 if ls.feasible else None, level.outcome.offered_rate, None, n)
    at = [lv for lv in measured.scores if lv.feasible and lv.scale == res.scale]
    if not at or res.scale is None:
        return Measurement(0.0, None, None, res, res.levels)
    rps = offered_rate(wl, res.scale)
    return Measurement(at[0].output_throughput, res.scale, rps, res, res.levels)
