"""The capacity lattice and the search on it (pure; docs/tuning.md#1-the-capacity-lattice).

Loads lie on the fixed lattice ``low * (1 + resolution)^k`` for ``k = 0..top`` (the last
point not above ``high``). A configuration's capacity is the highest lattice point that is
feasible and whose next point up is infeasible; both points are measured. The search keeps a
bracket ``[ok, bad]`` of a measured feasible and a measured infeasible point and bisects it on
the lattice until they are neighbours.

- Without a hint it measures the top point, then the middle one (by index), then the bottom
  one only when the middle is infeasible, then bisects: every trial and the baseline get the
  same resolution, whatever ran before them.
- With a hint it measures the hint and its neighbour first and gallops away from it (steps
  1, 2, 4, ...) until the bracket closes, then bisects. The bracket narrows only between
  measured ends, so when feasibility is monotone in load both searches end on the same
  lattice point. Under noise they need not: a hint at a high load keeps lucky feasible points
  there, which is why studies search without one.
- When feasibility is not monotone (noise), the answer is still one defined lattice point: a
  measured feasible point whose measured next point up is infeasible, the same one every time
  the same measurements come back.

``max_levels`` is a safety cap; a search cut short by it reports the highest measured feasible
point below its lowest measured infeasible one and says it did not converge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CapacityResult", "CapacitySearch", "Lattice", "Status"]

# found: a measured feasible point with a measured infeasible next point up
# at_top: even the top of the lattice is feasible (capacity >= high)
# below_low: even the bottom of the lattice is infeasible
# stopped: the caller stopped early (over-length: no load can help; a dead worker)
# budget: max_levels ran out first
Status = Literal["found", "at_top", "below_low", "stopped", "budget"]


@dataclass(frozen=True)
class Lattice:
    low: float
    high: float
    resolution: float

    def __post_init__(self) -> None:
        if not (self.low > 0 and self.high >= self.low):
            raise ValueError(f"need 0 < low <= high, got low={self.low}, high={self.high}")
        if not self.resolution > 0:
            raise ValueError(f"resolution must be > 0, got {self.resolution}")

    @property
    def top(self) -> int:
        """Index of the highest lattice point (not above ``high``)."""
        return math.floor(math.log(self.high / self.low) / math.log1p(self.resolution) + 1e-9)

    def scale(self, k: int) -> float:
        if not 0 <= k <= self.top:
            raise ValueError(f"lattice index {k} outside 0..{self.top}")
        return self.low * (1.0 + self.resolution) ** k

    def index(self, scale: float) -> int:
        """The lattice point nearest ``scale`` (clipped to the lattice)."""
        if scale <= 0:
            return 0
        k = round(math.log(scale / self.low) / math.log1p(self.resolution))
        return min(max(k, 0), self.top)


@dataclass(frozen=True)
class CapacityResult:
    status: Status
    index: int | None  # the capacity's lattice index; None when nothing was feasible
    scale: float | None
    converged: bool  # the answer is a measured edge (or the top of the lattice)
    levels: int  # levels measured


@dataclass
class CapacitySearch:
    lattice: Lattice
    max_levels: int = 24
    hint: float | None = None
    measured: dict[int, bool] = field(default_factory=dict)
    _ok: int | None = None  # bracket: measured feasible
    _bad: int | None = None  # bracket: measured infeasible
    _step: int = 1  # galloping step away from the hint
    _stopped: bool = False

    def __post_init__(self) -> None:
        if self.max_levels < 2:
            raise ValueError("max_levels must be >= 2")

    def record(self, k: int, feasible: bool) -> None:
        """The outcome of measuring lattice point ``k`` (as asked by :meth:`next_index`)."""
        self.measured[k] = feasible
        if feasible:
            if self._bad is not None and k >= self._bad:
                return  # above the bracket's infeasible end (noise): the bracket stays
            if self._ok is None or k > self._ok:
                self._ok = k
        else:
            if self._ok is not None and k <= self._ok:
                return
            if self._bad is None or k < self._bad:
                self._bad = k

    def stop(self) -> None:
        """End the search now (e.g. requests too long for max_model_len: no load helps)."""
        self._stopped = True

    def _closed(self) -> bool:
        lat = self.lattice
        if self._ok is not None and self._ok >= lat.top:
            return True  # feasible at the top
        if self._bad is not None and self._bad <= 0:
            return True  # infeasible at the bottom
        return self._ok is not None and self._bad is not None and self._bad - self._ok <= 1

    def next_index(self) -> int | None:
        """The next lattice point to measure, or None when the search is over."""
        if self._stopped or self._closed() or len(self.measured) >= self.max_levels:
            return None
        top = self.lattice.top
        ok, bad = self._ok, self._bad
        if ok is not None and bad is not None:
            return (ok + bad) // 2
        if ok is None and bad is None:
            if self.hint is None:
                return top
            return self.lattice.index(self.hint)
        k = self._gallop(ok, bad, top)
        self._step *= 2
        return k

    def _gallop(self, ok: int | None, bad: int | None, top: int) -> int:
        if self.hint is None:
            # no hint: the top was measured infeasible. The middle point next (1x the
            # workload's rate on the default lattice), and the bottom only when the middle is
            # infeasible too: the bottom is the longest level to replay (4x the middle's
            # duration at 0.25x), and a config feasible in the middle never needs it
            mid = top // 2
            if bad is not None and bad > mid and mid not in self.measured:
                return mid
            return 0
        if bad is None:
            assert ok is not None
            return min(ok + self._step, top)
        return max(bad - self._step, 0)

    def result(self) -> CapacityResult:
        n = len(self.measured)
        lat = self.lattice
        ok, bad = self._ok, self._bad
        at = lat.scale(ok) if ok is not None else None
        if self._stopped and not self._closed():
            return CapacityResult("stopped", ok, at, False, n)
        if ok is not None and ok >= lat.top:
            return CapacityResult("at_top", ok, lat.scale(ok), True, n)
        if bad is not None and bad <= 0 and ok is None:
            return CapacityResult("below_low", None, None, True, n)
        if ok is not None and bad is not None and bad - ok <= 1:
            return CapacityResult("found", ok, lat.scale(ok), True, n)
        return CapacityResult("budget", ok, at, False, n)
