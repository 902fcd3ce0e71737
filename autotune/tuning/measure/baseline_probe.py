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
from autotune.tuning.measure.level_search import capacity_search
from autotune.tuning.measure.scoring import Slo
from autotune.tuning.measure.trial import lattice_of
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
