"""Where the next trial is settled (docs/tuning.md#14-settling-losing-trials): the best
capacity so far, read from the study's trials (pure).

A trial that cannot hold the best capacity so far cannot become the recommendation, so its
search ends there after one level (two after a near miss). The baseline and the configs a
user enqueued are measured in full; so is every trial of a one-level mode, and every trial
while no trial's capacity is a measured edge.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.config import StudyConfig
from autotune.tuning.measure.level_plan import SettleBar
from autotune.tuning.search.strategy import best_trial

__all__ = ["SETTLED_STATUSES", "settle_bar"]

# capacities that are measured edges (or the top of the lattice): a bar to settle against
SETTLED_STATUSES = ("found", "at_top")


def _full(stage: str) -> bool:
    """Stages measured in full: the baseline and what the user enqueued."""
    return stage == "baseline" or stage == "enqueued" or stage.startswith("enqueue-")


def settle_bar(
    cfg: StudyConfig, trials: Sequence[FrozenTrial], stage: str, band_pct: float | None
) -> SettleBar | None:
    """The bar the next trial of ``stage`` is settled at, or None to measure it in full."""
    if cfg.mode != "slo-capacity" or not cfg.strategy.settle or _full(stage):
        return None
    best = best_trial(trials)
    if best is None or any(v > 0 for v in best.constraints.values()):
        return None  # nothing feasible yet: nothing to settle against
    scale = best.user_attrs.get("capacity_scale")
    status = best.user_attrs.get("capacity_status")
    if scale is None or status not in SETTLED_STATUSES:
        return None
    return SettleBar(float(scale), best.number, band_pct)
