"""Levels a study already measured, as calibration targets.

docs/calibrate.md#4-from-measured-levels.

A level is a workload replayed at some rate on one engine config; what it measured (the
bench summary's median TTFT and inter-token gap) can pin the twin's constants as the probes
do, at no extra GPU time. The twin predicts a level by replaying the same workload at the
same rate on the same engine args in virtual time, so both sides are the same statistic of
the same load. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.calibrate.observe import Observation
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, replay_level
from autotune.workload.core import Workload

__all__ = ["LEVEL_METRICS", "LevelTarget", "level_observations", "predict_level"]

# (summary key, observation metric, factor to seconds): the medians, which a few slow
# requests at a level's edge do not move as they move a mean
LEVEL_METRICS = (("median_ttft_ms", "ttft", 1e-3), ("median_itl_ms", "itl", 1e-3))


@dataclass(frozen=True)
class LevelTarget:
    """One measured level: ``workload`` already at the level's rate, the engine args it ran
    with and the warm-up requests sent before it."""

    name: str
    args: EngineArgs
    workload: Workload
    warmup: int = 0


def level_observations(name: str, summary: Mapping[str, Any]) -> list[Observation]:
    """A level's figures from its bench summary (a missing or zero figure is left out)."""
    out = []
    for key, metric, to_s in LEVEL_METRICS:
        v = summary.get(key)
        if isinstance(v, int | float) and v > 0:
            out.append(Observation(name, metric, float(v) * to_s))
    return out


def predict_level(
    target: LevelTarget, model: ModelProfile, hardware: HardwareProfile
) -> list[Observation]:
    """The level's figures as the simulated engine on ``hardware`` gives them (no jitter)."""
    lvl = replay_level(
        model, hardware, target.args, target.workload, seed=0, jitter_cv=0.0, warmup=target.warmup
    )
    return level_observations(target.name, lvl.summary)
