"""Where the next trial is settled (docs/tuning.md#14-settling-losing-trials): the best
capacity so far, read from the study's trials (pure).

A trial that cannot hold the best capacity so far cannot become the recommendation, so its
search ends there after one level (two after a near miss). The baseline and the configs a
user enqueued are measured in full; so is every trial of a one-level mode, and every trial
while no trial's capacity is a measured edge.

A trial TPE proposed (the joint stages) is settled lower: at the capacity of the last trial
in TPE's good group. TPE ranks trials only to split them into a good group (the best
``ceil(n / 10)``) and the rest, and puts a pruned trial in the rest; a trial that fails that
bar belongs to the rest whatever its exact figure, and every trial that could join the good
group is measured exactly, so settling never changes what TPE learns. A compass move of the
staged joint refinement is settled at the best, as a stage's trial is: the compass reads only
whether a move beat the best point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

from autotune.config import StudyConfig
from autotune.tuning.attrs import capacity_of
from autotune.tuning.measure.level_plan import SettleBar
from autotune.tuning.search.home_size import home_trial
from autotune.tuning.search.ranking import feasible_ranked

__all__ = ["SETTLED_STATUSES", "TPE_STAGES", "full_search", "settle_bar", "tpe_good_group"]

# the stages whose trials a TPE sampler proposes from the trials' values (autotune.tuning.
# search.strategy): the joint refinement of the staged plan, every trial of the joint plan
TPE_STAGES = ("joint",)


def tpe_good_group(n: int) -> int:
    """How many of ``n`` finished trials TPE's default split counts as good (Optuna's
    ``default_gamma``: a tenth, rounded up, at most 25)."""
    return min(math.ceil(0.1 * n), 25)


# capacities that are measured edges (or the top of the lattice): a bar to settle against
SETTLED_STATUSES = ("found", "at_top")


def full_search(stage: str) -> bool:
    """Stages measured in full: the baseline and what the user enqueued."""
    return stage == "baseline" or stage == "enqueued" or stage.startswith("enqueue-")


def settle_bar(
    cfg: StudyConfig,
    trials: Sequence[FrozenTrial],
    stage: str,
    band_pct: float | None,
    *,
    compass: bool = False,
) -> SettleBar | None:
    """The bar the next trial of ``stage`` is settled at, or None to measure it in full;
    ``compass``: the trial is a compass move (:func:`autotune.tuning.attrs.compass_moved`),
    not TPE's proposal."""
    if cfg.mode != "slo-capacity" or not cfg.strategy.settle or full_search(stage):
        return None
    best = home_trial(trials)
    if best is None or any(v > 0 for v in best.constraints.values()):
        return None  # nothing feasible yet: nothing to settle against
    if stage in TPE_STAGES and not compass:
        finished = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED))
        good = feasible_ranked(trials)
        k = tpe_good_group(finished)
        if len(good) < k:
            return None  # TPE would fill its good group with pruned trials: measure in full
        best = good[k - 1]
    scale = capacity_of(best)
    status = best.user_attrs.get("capacity_status")
    if scale is None or status not in SETTLED_STATUSES:
        return None
    return SettleBar(float(scale), best.number, band_pct)
