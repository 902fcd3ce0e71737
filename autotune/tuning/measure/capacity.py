"""The capacity lattice and the search on it (pure; docs/tuning.md#1-the-capacity-lattice).

Loads lie on the fixed lattice ``low * (1 + resolution)^k`` for ``k = 0..top`` (the last
point not above ``high``; :mod:`autotune.tuning.measure.lattice`). A configuration's
capacity is the highest lattice point that is feasible and whose next point up is
infeasible; both points are measured. A point is feasible when it held in the majority of
its runs (one run, until a point is re-measured). The search keeps a bracket ``[ok, bad]``
of a measured feasible and a measured infeasible point and bisects it on the lattice until
they are neighbours.

- Without a hint it measures the top point, then the middle one (by index), then the bottom
  one only when the middle is infeasible, then bisects: every trial and the baseline get the
  same resolution, whatever ran before them.
- With a hint it measures the hint and its neighbour first and gallops away from it (steps
  1, 2, 4, ...) until the bracket closes, then bisects. ``climb`` scales the upward steps
  (3: the hint, then 3, 6, 12, ... points above it): a held level replays to its end and
  a failed one stops early, so overshooting upwards is the cheap mistake when the capacity
  may lie several points away (validation runs, docs/tuning.md#7-validation); for the same
  reason ``lean`` moves bisection's probe above the middle (``LEAN``). When the hint held
  with a measured latency headroom (p99 at 80 % of its SLO spans 22 points of 1 %), the
  first step up is :data:`ROOM_SHARE` of those points instead, and no later step passes
  :data:`ROOM_CAP` times the highest held level's. The bracket narrows only between
  measured ends, so when feasibility is monotone in load both searches
  end on the same lattice point. Under noise they need not: a hint at a high load keeps
  lucky feasible points there, which is why studies search without one.
- Settling (docs/tuning.md#14-settling-losing-trials): with a ``settle`` point (the best
  capacity so far) it measures that point first. A configuration that fails there cannot
  become the recommendation: the search ends ``settled``, its capacity only bounded (below
  that point). A failure by less than the server's noise (``near``) is measured again and
  the majority of up to 3 runs decides. A configuration that holds goes on as the search
  from a hint does, upwards only.
- Re-measurement (docs/tuning.md#1-the-capacity-lattice, "Noise"): once the runs contradict
  monotone feasibility (a run that held at or above a point where a run failed), or always
  when ``confirm`` is set, the closed bracket's two points (the capacity point and the next
  one up) are measured again until each has a majority: 2 agreeing runs, or 3 runs. From
  the first contradiction on, the bracket is the majorities': the lowest point whose
  majority failed, and the highest point below it whose majority held. When a majority
  overturns a boundary point the search goes on in the new bracket. Re-runs are capped at
  :data:`REMEASURE_RUNS` per search. A search that saw no contradiction and no ``confirm``
  measures each point once, exactly as without this rule.

``max_levels`` is a safety cap on all runs; a search cut short by it reports the highest
feasible point below its lowest infeasible one and says it did not converge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from autotune.tuning.measure.lattice import Lattice

__all__ = [
    "MAX_RUNS",
    "REMEASURE_RUNS",
    "ROOM_CAP",
    "ROOM_SHARE",
    "CapacityResult",
    "CapacitySearch",
    "Lattice",
    "Runs",
    "Spread",
    "Status",
    "spread_of",
]

# found: a feasible point with an infeasible next point up, both measured
# at_top: even the top of the lattice is feasible (capacity >= high)
# below_low: even the bottom of the lattice is infeasible
# stopped: the caller stopped early (over-length: no load can help; a dead worker)
# budget: max_levels ran out first
# settled: it failed the settle point (the best capacity so far): capacity below it
Status = Literal["found", "at_top", "below_low", "stopped", "budget", "settled"]

# Bisection's probe, as a fraction of the bracket from its feasible end, where early stop
# ends a failed level at about a fifth of a held one (docs/tuning.md#1-the-capacity-lattice)
LEAN = 0.6

# The first step up from a held hint (a settle point, a validation run's start), as a share of
# the lattice points its latency headroom spans, and a later step's cap, as a multiple of its
# held level's (docs/tuning.md#1-the-capacity-lattice, "The first step up", "A later step up")
ROOM_SHARE = 0.5
ROOM_CAP = 2.0

# Runs of one point at most: with 3 a majority always exists, and 2 agreeing runs already
# are one (docs/tuning.md#1-the-capacity-lattice, "Noise").
MAX_RUNS = 3
# Re-runs (runs of a point after its first) per search: 2 more of each boundary point.
REMEASURE_RUNS = 2 * (MAX_RUNS - 1)


@dataclass(frozen=True)
class Runs:
    """The runs of one lattice point: how many held its SLOs, of how many."""

    held: int
    total: int

    @property
    def feasible(self) -> bool:  # held in the majority of its runs
        return 2 * self.held > self.total

    def text(self) -> str:  # "2/3"
        return f"{self.held}/{self.total}"


@dataclass(frozen=True)
class Spread:
    """How sure a capacity is (docs/tuning.md#1-the-capacity-lattice, "Noise"): the runs at
    the capacity point and at the next point up (None: no such point, or not measured), and
    the band of loads in which the capacity is uncertain: from the lowest lattice point where
    a run failed to the highest where a run held, widened to contain the capacity point and
    the next one up. With monotone runs the band is those two points, one step apart."""

    at: Runs | None
    above: Runs | None
    band_low: float | None  # scales
    band_high: float | None
    monotone: bool  # no run held at or above a point where a run failed

    def text(self) -> str:
        """E.g. ``held 2/2, next point up 1/3; uncertain between x1.010 and x1.041``."""
        runs = []
        if self.at is not None:
            runs.append(f"held {self.at.text()}")
        if self.above is not None:
            runs.append(f"next point up {self.above.text()}")
        parts = [", ".join(runs)] if runs else []
        if self.band_low is not None and self.band_high is not None:
            parts.append(f"uncertain between x{self.band_low:.3f} and x{self.band_high:.3f}")
        return "; ".join(parts)


def spread_of(lattice: Lattice, runs: Mapping[int, Sequence[bool]], index: int | None) -> Spread:
    """The :class:`Spread` of a capacity at lattice point ``index`` (None: nothing feasible)
    given every run of each measured point (the one rule: the search's result and a stored
    trial's levels both use it)."""

    def of(k: int | None) -> Runs | None:
        rs = runs.get(k) if k is not None else None
        return Runs(sum(rs), len(rs)) if rs else None

    above = 0 if index is None else index + 1
    failed = [k for k, rs in runs.items() if not all(rs)]
    held = [k for k, rs in runs.items() if any(rs)]
    monotone = not failed or not held or min(failed) > max(held)
    lows = failed + ([index] if index is not None else [])
    highs = held + ([above] if above <= lattice.top and index is not None else [])
    lo = min(lows, default=None)
    hi = max(highs, default=lo)
    return Spread(
        of(index),
        of(above) if above <= lattice.top else None,
        lattice.scale(lo) if lo is not None else None,
        lattice.scale(hi) if hi is not None else None,
        monotone,
    )


@dataclass(frozen=True)
class CapacityResult:
    status: Status
    index: int | None  # the capacity's lattice index; None when nothing was feasible
    scale: float | None
    converged: bool  # the answer is a measured edge (or the top of the lattice)
    levels: int  # levels measured (runs, re-measurements included)
    spread: Spread | None = None  # how sure the capacity is
    # settled: the load scale it failed to hold (its capacity lies below it)
    below: float | None = None

    @property
    def monotone(self) -> bool:
        """Every run agreed with one capacity (no re-measurement was needed to decide)."""
        return self.spread is None or self.spread.monotone


@dataclass
class CapacitySearch:
    lattice: Lattice
    max_levels: int = 24
    hint: float | None = None
    # re-measure the boundary points even when the runs never contradicted each other
    confirm: bool = False
    # the settle point's lattice index (the best capacity so far), measured first
    settle: int | None = None
    # the upward gallop's first step from a held hint (then doubling), where its first run
    # measured no latency headroom (record's ``margin``)
    climb: int = 1
    lean: float = 0.5  # bisection's probe in the bracket: 0.5 its middle, rounded down
    runs: dict[int, list[bool]] = field(default_factory=dict)  # every run, by lattice point
    _ok: int | None = None  # bracket: measured feasible (first runs, until a contradiction)
    _bad: int | None = None  # bracket: measured infeasible
    _step: int = 1  # galloping step away from the hint
    _room: dict[int, float] = field(default_factory=dict)  # held points' headroom, in points
    _stopped: bool = False
    _noisy: bool = False  # the runs contradicted monotone feasibility: majorities decide

    def __post_init__(self) -> None:
        if self.max_levels < 2:
            raise ValueError("max_levels must be >= 2")
        if self.climb < 1:
            raise ValueError(f"climb must be >= 1, got {self.climb}")
        if not 0.5 <= self.lean < 1.0:
            raise ValueError(f"lean must be in [0.5, 1), got {self.lean}")
        if self.settle is not None:
            self.settle = min(max(self.settle, 0), self.lattice.top)
            self.hint = self.lattice.scale(self.settle)
        self._near = False  # the settle point's first run failed by less than the noise

    @property
    def measured(self) -> dict[int, bool]:
        """Each measured point's verdict (held in the majority of its runs), in the order
        the points were first measured."""
        return {k: Runs(sum(rs), len(rs)).feasible for k, rs in self.runs.items()}

    @property
    def levels(self) -> int:  # runs measured
        return sum(len(rs) for rs in self.runs.values())

    def _reruns(self) -> int:
        return sum(len(rs) - 1 for rs in self.runs.values())

    def record(
        self, k: int, feasible: bool, *, near: bool = False, margin: float | None = None
    ) -> None:
        """The outcome of measuring lattice point ``k`` (as asked by :meth:`next_index`);
        a point measured again adds a run. ``near``: a failure by less than the server's
        noise (only the settle point's first run uses it: it is measured again).
        ``margin``: the run's worst p99 / SLO (None: not measured). When the first run of
        the hint's point (a settle point is one) held with a measured margin, the search
        climbs from there by :data:`ROOM_SHARE` of the lattice points its headroom spans
        (at least 1) instead of ``climb`` (later steps: :data:`ROOM_CAP`)."""
        if k == self.settle and k not in self.runs:
            self._near = near and not feasible
        if feasible and margin is not None and 0 < margin <= 1 and k not in self.runs:
            self._room[k] = self.lattice.steps(1 / margin)
            if self.hint is not None and k == self.lattice.index(self.hint):
                self.climb = max(1, round(ROOM_SHARE * self._room[k]))
        if not self._noisy and self._contradicts(k, feasible):
            self._noisy = True
        self.runs.setdefault(k, []).append(feasible)
        if self._noisy:
            return  # the bracket is the majorities' (:meth:`_bracket`)
        if feasible:
            if self._bad is not None and k >= self._bad:
                return  # above the bracket's infeasible end: the bracket stays
            if self._ok is None or k > self._ok:
                self._ok = k
        else:
            if self._ok is not None and k <= self._ok:
                return
            if self._bad is None or k < self._bad:
                self._bad = k

    def _contradicts(self, k: int, feasible: bool) -> bool:
        """A run that held at or above a failed one, or failed at or below a held one."""
        if feasible:
            return any(i <= k and not all(rs) for i, rs in self.runs.items())
        return any(j >= k and any(rs) for j, rs in self.runs.items())

    def stop(self) -> None:
        """End the search now (e.g. requests too long for max_model_len: no load helps)."""
        self._stopped = True

    def _holds(self, k: int) -> bool:
        """Point ``k``'s majority; a tie that another run may still break keeps its first
        run's verdict until then (so the bracket does not move on half the evidence)."""
        rs = self.runs[k]
        if 2 * sum(rs) == len(rs) and self._may_rerun() and len(rs) < MAX_RUNS:
            return rs[0]
        return 2 * sum(rs) > len(rs)

    def _may_rerun(self) -> bool:
        return self._reruns() < REMEASURE_RUNS and self.levels < self.max_levels

    def _bracket(self) -> tuple[int | None, int | None]:
        if not self._noisy:
            return self._ok, self._bad
        holds = {k: self._holds(k) for k in self.runs}
        bad = min((k for k, h in holds.items() if not h), default=None)
        ok = max((k for k, h in holds.items() if h and (bad is None or k < bad)), default=None)
        return ok, bad

    def _closed(self) -> bool:
        ok, bad = self._bracket()
        if ok is not None and ok >= self.lattice.top:
            return True  # feasible at the top
        if bad is not None and bad <= 0:
            return True  # infeasible at the bottom
        return ok is not None and bad is not None and bad - ok <= 1

    def _settling(self) -> Literal["measure", "settled", "open"] | None:
        """Where the settle point stands: to be measured (again), failed (the search is
        settled), or held (the search goes on upwards). None: no settle point."""
        if self.settle is None:
            return None
        rs = self.runs.get(self.settle, [])
        if not rs:
            return "measure"
        if rs[0] and len(rs) == 1:
            return "open"
        if not self._near:
            return "settled" if not rs[0] else "open"
        held = sum(rs)
        if held >= 2 or (len(rs) >= MAX_RUNS and 2 * held > len(rs)):
            return "open"
        if len(rs) - held >= 2 or len(rs) >= MAX_RUNS:
            return "settled"
        return "measure"

    def next_index(self) -> int | None:
        """The next lattice point to measure (possibly one measured before), or None when
        the search is over."""
        if self._stopped or self.levels >= self.max_levels:
            return None
        settling = self._settling()
        if settling == "settled":
            return None
        if settling == "measure":
            assert self.settle is not None
            return self.settle
        if self._closed():
            return self._remeasure()
        top = self.lattice.top
        ok, bad = self._bracket()
        if ok is not None and bad is not None:
            if self.lean == 0.5:
                return (ok + bad) // 2
            return ok + min(bad - ok - 1, max(1, math.ceil((bad - ok) * self.lean - 1e-9)))
        if ok is None and bad is not None and self.hint is None and (top // 2) in self.runs:
            # the middle failed too: bisect towards the bottom as if a point below it held.
            # The bottom is the longest level to replay (at 0.25x, 4x the middle's duration)
            # and only a config that fails everywhere above it needs it measured
            # (docs/tuning.md#1-the-capacity-lattice)
            return bad // 2
        if ok is None and bad is None:
            if self.hint is None:
                return top
            return self.lattice.index(self.hint)
        k = self._gallop(ok, bad, top)
        self._step *= 2
        return k

    def _remeasure(self) -> int | None:
        """A boundary point (the capacity point, the next one up) without a majority yet:
        the one with the fewest runs, the lower first. None: no re-measurement is due."""
        if not (self._noisy or self.confirm) or not self._may_rerun():
            return None
        ok, _ = self._bracket()
        points = [0] if ok is None else [ok, ok + 1]
        open_ = [k for k in points if k <= self.lattice.top and not self._decided(k)]
        return min(open_, key=lambda k: (len(self.runs.get(k, ())), k), default=None)

    def _decided(self, k: int) -> bool:
        rs = self.runs.get(k, [])
        held = sum(rs)
        return len(rs) >= MAX_RUNS or held >= 2 or len(rs) - held >= 2

    def _gallop(self, ok: int | None, bad: int | None, top: int) -> int:
        if self.hint is None:
            # no hint: the top was measured infeasible. The middle point next (1x the
            # workload's rate on the default lattice), and the bottom only when the middle is
            # infeasible too: the bottom is the longest level to replay (4x the middle's
            # duration at 0.25x), and a config feasible in the middle never needs it
            mid = top // 2
            if bad is not None and bad > mid and mid not in self.runs:
                return mid
            return 0
        if bad is None:
            assert ok is not None
            step = self._step * self.climb
            if ok in self._room:
                step = max(1, min(step, math.ceil(ROOM_CAP * self._room[ok])))
            return min(ok + step, top)
        return max(bad - self._step, 0)

    def result(self) -> CapacityResult:
        n = self.levels
        lat = self.lattice
        if self._settling() == "settled":
            assert self.settle is not None
            below = lat.scale(self.settle)
            return CapacityResult(
                "settled", None, None, True, n, spread_of(lat, self.runs, None), below
            )
        ok, bad = self._bracket()
        at = lat.scale(ok) if ok is not None else None
        spread = spread_of(lat, self.runs, ok)
        if self._stopped and not self._closed():
            return CapacityResult("stopped", ok, at, False, n, spread)
        if ok is not None and ok >= lat.top:
            return CapacityResult("at_top", ok, at, True, n, spread)
        if bad is not None and bad <= 0 and ok is None:
            return CapacityResult("below_low", None, None, True, n, spread)
        if ok is not None and bad is not None and bad - ok <= 1:
            return CapacityResult("found", ok, at, True, n, spread)
        return CapacityResult("budget", ok, at, False, n, spread)
