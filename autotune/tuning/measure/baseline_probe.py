"""The baseline probe: the load a study's baseline sustains within its SLOs, from a quick
sim-virtual capacity search; it sizes ``max_num_seqs`` for the load (``study create`` and the
nightly warm start, docs/nightly.md#4-the-warm-start)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import SimStartupError
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.level_plan import LevelPlan, measure
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.workload.core import Workload

__all__ = ["baseline_capacity"]


async def baseline_capacity(
    cfg: StudyConfig,
    model: ModelProfile,
    hw: HardwareProfile,
    wl: Workload,
    baseline: Mapping[str, Any],
) -> float:
    """The load scale ``baseline`` sustains within the SLOs: a quick sim-virtual capacity
    search (1.0 when the simulator cannot start it)."""
    plan = LevelPlan.probe(cfg)
    runner = VirtualRunner(
        model,
        hw,
        model_name=cfg.model.name,
        static_args={},
        seed=cfg.seed,
        jitter_cv=0.0,
        early_stop=plan.early_stop,  # the probe's plan says: full replays
    )
    try:
        await runner.start(baseline, "capacity-probe")
    except SimStartupError:
        return 1.0
    measured = await measure(runner, wl, plan)
    res = measured.capacity
    assert res is not None  # a probe is a capacity search
    return res.scale if res.scale is not None else plan.lattice.low
