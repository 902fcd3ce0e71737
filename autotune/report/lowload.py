"""A study whose capacity lies below the lowest load it tried: what to lower, and to what
(pure; takes stored trial records).

In ``slo-capacity`` mode every trial starts its capacity search on the study's lattice,
whose bottom is ``strategy.capacity_low`` times the workload's rate
(docs/tuning.md#1-the-capacity-lattice). When no trial meets the SLOs even there, running
longer cannot help: every further trial measures the same lattice. The lattice must reach
lower, and the lowest level's own figures say how much lower: a config that completed
requests at only a share of the offered rate is saturated there, and its SLO-meeting load
lies below that share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.loadgen.stopped import StopInfo
from autotune.store import LevelRecord, TrialRecord

__all__ = ["HEADROOM", "LowLoad", "below_lowest_load", "lower_capacity_low_hint"]

# The load that meets latency SLOs lies below the load a config saturates at (its queue then
# grows without bound); half the served share puts the lattice's bottom clearly below it.
HEADROOM = 0.5


@dataclass(frozen=True)
class LowLoad:
    """The lowest level of the trial that came closest: its scale (``capacity_low``), the
    rate offered there, the rate of requests it completed (req/s), and whether the level
    stopped early (docs/tuning.md#10-early-stop-inside-a-level)."""

    trial: int
    scale: float
    offered_rate: float | None
    served_rate: float
    stopped_early: bool = False

    @property
    def served_share(self) -> float | None:
        """Completed over offered requests per second; None when unknown: no offered rate,
        or a level stopped early, whose throughput covers only its start."""
        if self.stopped_early or not self.offered_rate or self.offered_rate <= 0:
            return None
        return min(1.0, self.served_rate / self.offered_rate)

    def suggested_low(self) -> float:
        """A ``capacity_low`` below the load this trial could serve, two significant digits,
        rounded down (a trial that completed nothing there counts as serving 1 %; with the
        share unknown, two halvings)."""
        share = self.served_share
        x = self.scale * (HEADROOM if share is None else max(share, 0.01)) * HEADROOM
        digits = 1 - math.floor(math.log10(x))
        return float(math.floor(x * 10**digits) / 10**digits)


def _lowest_infeasible(t: TrialRecord) -> LevelRecord | None:
    """The trial's lowest level, when no level met the SLOs and not only for over-length
    requests (those are too long at any load: no lower load helps)."""
    if t.state != "COMPLETE" or t.feasible or not t.levels or any(lv.feasible for lv in t.levels):
        return None
    low = min(t.levels, key=lambda lv: lv.scale)
    if low.violations and all(v.get("name") == "overlength_rate" for v in low.violations):
        return None
    return low


def below_lowest_load(trials: Sequence[TrialRecord], mode: str) -> LowLoad | None:
    """None unless the study is in ``slo-capacity`` mode, has no feasible trial, and every
    measured trial missed the SLOs at its lowest load for a reason a lower load can fix; then
    the lowest level of the trial that served the largest share of its offered rate."""
    done = [t for t in trials if t.state == "COMPLETE"]
    if mode != "slo-capacity" or any(t.feasible for t in done):
        return None
    measured = [t for t in done if t.levels]
    lows = [(t, _lowest_infeasible(t)) for t in measured]
    if not lows or any(low is None for _, low in lows):
        return None
    best = [
        LowLoad(
            t.optuna_trial_number,
            low.scale,
            low.offered_rate,
            low.request_throughput,
            # any stop: even one once every request was sent cut the unfinished ones
            StopInfo.of(low.metrics) is not None,
        )
        for t, low in lows
        if low is not None
    ]
    # the trial that served the largest known share (an unknown share ranks last)
    return max(best, key=lambda x: (x.served_share or 0.0, -x.trial))


def lower_capacity_low_hint(low: LowLoad) -> str:
    """The advice line: lower ``strategy.capacity_low``, to what and why."""
    to = low.suggested_low()
    rate = f" ({low.offered_rate:,.2f} req/s)" if low.offered_rate else ""
    share = low.served_share
    if share is None:
        why = (
            f"trial {low.trial} missed the SLOs at the lowest load tried, x{low.scale:g}{rate}, "
            "so early that its throughput there does not say how far below it lies; if a "
            "lower load does not help either, relax the SLOs"
        )
    elif share < 0.9:
        why = (
            f"at the lowest load tried, x{low.scale:g}{rate}, trial {low.trial} completed "
            f"{low.served_rate:,.2f} req/s ({share:.0%} of it)"
        )
    else:
        why = (
            f"trial {low.trial} kept up with the lowest load tried, x{low.scale:g}{rate}, "
            "but missed the SLOs; if a lower load does not help either, relax the SLOs"
        )
    return (
        f"its capacity lies below the lowest load tried: lower strategy.capacity_low to "
        f"{to:g} or less (running longer measures the same loads again; {why})"
    )
