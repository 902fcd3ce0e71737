"""Capacities as bounds, not false precision (pure; docs/usage.md#1-commands, the capacity
lattice in docs/tuning.md#1-the-capacity-lattice).

A capacity search that ended at the top of the lattice measured only that the config holds
its SLOs there: its capacity is *at least* the top load ("≥ 16.00 req/s (top of the range)").
One that failed even at the bottom has a capacity *below* the lowest load tried
("< 1.00 req/s (the lowest load tried)"), and a settled one below the best capacity so far
("< 8.49 req/s (settled against trial 20)", docs/tuning.md#14-settling-losing-trials). A
gain computed from such a capacity is a bound too. This module owns that wording: every
reader (``study show``, ``study best``, the progress lines, the reports, the exports,
optuna-dashboard's notes) prints capacities through it, and when the best config sits at
the top it names the setting that widens the range (``strategy.capacity_high``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.store import TrialRecord
from autotune.tuning.measure.capacity import Lattice, Spread
from autotune.tuning.measure.findings import capacity_rps, capacity_spread

__all__ = [
    "AT_TOP",
    "BELOW_LOW",
    "SETTLED",
    "Capacity",
    "capacity_cell",
    "capacity_of",
    "gain_bound_text",
    "state_word",
    "status_at",
    "trial_capacity",
    "widen_hint",
]

# the statuses of autotune.tuning.measure.capacity that make a capacity a bound; every other
# status ("found", "stopped", "budget", None) is shown as the measured figure
AT_TOP = "at_top"
BELOW_LOW = "below_low"
SETTLED = "settled"
Bound = Literal["≥", "<", ""]

_TOP_WHY = "top of the range"
_LOW_WHY = "the lowest load tried"


@dataclass(frozen=True)
class Capacity:
    """A capacity as shown: the load scale and request rate (at_top: the top's; below_low:
    the lowest load's) and the search's status."""

    scale: float | None
    rps: float | None
    status: str | None = None
    # how sure it is: runs held at it and the next point up, the uncertain band (None: no
    # lattice to read it on; docs/tuning.md#1-the-capacity-lattice, "Noise")
    spread: Spread | None = None
    against: int | None = None  # settled: the trial whose capacity it failed to hold

    @property
    def bound(self) -> Bound:
        return "≥" if self.status == AT_TOP else "<" if self.status in (BELOW_LOW, SETTLED) else ""

    @property
    def exact(self) -> bool:
        return not self.bound

    def _why(self) -> str:
        if self.status == SETTLED:
            return "settled" + (
                f" against trial {self.against}" if self.against is not None else ""
            )
        return _TOP_WHY if self.status == AT_TOP else _LOW_WHY

    def rps_text(self) -> str:
        """``5.66 req/s``, ``≥ 16.00 req/s (top of the range)``, ``< 1.00 req/s (the lowest
        load tried)``; "-" when the rate is unknown."""
        if self.rps is None:
            return "-" if self.exact else self.scale_text()
        num = f"{self.rps:,.2f} req/s"
        return num if self.exact else f"{self.bound} {num} ({self._why()})"

    def scale_text(self) -> str:
        """``x1.414``, ``≥ x4.000 (top of the range)``, ``< x0.250 (the lowest load tried)``."""
        if self.scale is None:
            return "-"
        num = f"x{self.scale:.3f}"
        return num if self.exact else f"{self.bound} {num} ({self._why()})"

    def text(self) -> str:
        """Both: ``x1.414 (5.66 req/s)``, ``≥ x4.000 (≥ 16.00 req/s; top of the range)``."""
        if self.scale is None:
            return self.rps_text()
        if self.exact:
            rate = f" ({self.rps:,.2f} req/s)" if self.rps is not None else ""
            return f"x{self.scale:.3f}{rate}"
        b = self.bound
        rate = f"{b} {self.rps:,.2f} req/s; " if self.rps is not None else ""
        return f"{b} x{self.scale:.3f} ({rate}{self._why()})"

    def cell(self) -> str:
        """A table cell: the bound sign and the rate, without the words (the legend says
        them), e.g. ``≥16.00``."""
        if self.rps is None:
            return "-"
        return f"{self.bound}{self.rps:,.2f}"

    def spread_text(self) -> str | None:
        """How sure the capacity is, when a point was measured more than once or the runs
        went up and down with load (None otherwise: one run per point, monotone), e.g.
        ``held 2/3, next point up 1/3; uncertain between x1.010 and x1.041 (feasibility
        went up and down with load)``."""
        sp = self.spread
        if sp is None:
            return None
        rerun = any(r is not None and r.total > 1 for r in (sp.at, sp.above))
        if sp.monotone and not rerun:
            return None
        text = sp.text()
        return text + ("" if sp.monotone else " (feasibility went up and down with load)")

    def to_dict(self) -> dict[str, object]:
        """What an export carries beside the number: the status, the bound and (when read)
        the spread: runs held at the capacity and the next point up, the uncertain band."""
        sp = self.spread
        return {
            "scale": self.scale,
            "rps": self.rps,
            "status": self.status,
            "bound": self.bound,
            "settled_against": self.against,
            "spread": None
            if sp is None
            else {
                "held": sp.at.text() if sp.at is not None else None,
                "above_held": sp.above.text() if sp.above is not None else None,
                "band_low": sp.band_low,
                "band_high": sp.band_high,
                "monotone": sp.monotone,
            },
        }


def status_at(scale: float | None, lattice: Lattice) -> str | None:
    """``at_top`` when ``scale`` is the lattice's top point, else None (a measured edge)."""
    if scale is None or scale <= 0:
        return None
    return AT_TOP if lattice.index(scale) >= lattice.top else None


def _lowest(t: TrialRecord) -> tuple[float, float | None] | None:
    """(scale, offered req/s) of the lowest level of a trial that held at no load for a
    reason a lower load could fix (not only over-length requests, no worker failure)."""
    if t.state != "COMPLETE" or t.feasible or t.failure_class or not t.levels:
        return None
    # the lowest load's runs (a re-measured point has several; the trial's verdict is
    # their majority, docs/tuning.md#1-the-capacity-lattice)
    low = min(t.levels, key=lambda lv: (lv.scale, lv.feasible))
    if low.feasible:
        return None
    if low.violations and all(v.get("name") == "overlength_rate" for v in low.violations):
        return None
    return low.scale, low.offered_rate


def trial_capacity(t: TrialRecord, lattice: Lattice | None, mode: str) -> Capacity | None:
    """A stored trial's capacity as shown (None outside slo-capacity mode or unmeasured).
    With the study's ``lattice`` the status is the search's own: the top point, or nothing
    feasible down to the bottom point. Without it (a caller that has no config) a feasible
    trial with no measured load above its capacity is at least that load. A settled trial's
    is below the load it failed to hold."""
    if mode == "slo-capacity" and t.state == "PRUNED" and t.settled_below is not None:
        at = [lv for lv in t.levels if abs(lv.scale - t.settled_below) <= 1e-6 * t.settled_below]
        rps = at[0].offered_rate if at else None
        return Capacity(t.settled_below, rps, SETTLED, against=t.settled_against)
    if mode != "slo-capacity" or t.state != "COMPLETE":
        return None
    if t.feasible and t.capacity_scale is not None:
        rps = capacity_rps(t)
        if lattice is not None:
            status = status_at(t.capacity_scale, lattice)
            return Capacity(t.capacity_scale, rps, status, capacity_spread(t, lattice))
        above = [lv for lv in t.levels if lv.scale > t.capacity_scale * (1 + 1e-9)]
        return Capacity(t.capacity_scale, rps, AT_TOP if t.levels and not above else None)
    low = _lowest(t)
    if low is None:
        return None
    scale, rps = low
    if lattice is not None and lattice.index(scale) > 0:
        return None  # its search stopped above the bottom: no bound to state
    return Capacity(scale, rps, BELOW_LOW, capacity_spread(t, lattice) if lattice else None)


def state_word(state: str) -> str:
    """A trial's state as reports say it: Optuna's PRUNED is a settled trial here."""
    return "settled" if state == "PRUNED" else state.lower()


def capacity_cell(t: TrialRecord, lattice: Lattice | None, mode: str) -> str:
    """A report table's capacity cell: the rate, or its bound in words."""
    cap = trial_capacity(t, lattice, mode)
    if cap is not None and not cap.exact:
        return cap.rps_text()
    rps = capacity_rps(t)
    return "-" if rps is None else f"{rps:,.2f}"


def capacity_of(scale: float | None, rps: float | None, status: str | None) -> Capacity:
    """A capacity with the status stored beside it (a trial attribute, a progress event)."""
    return Capacity(scale, rps, status if status in (AT_TOP, BELOW_LOW) else None)


def gain_bound_text(gain_pct: float, cand: str | None, base: str | None, unit: str = " %") -> str:
    """``+12.3 %``; ``≥ +12.3 %`` when only the candidate's capacity is at the top (it may
    hold more), ``≤ +12.3 %`` when only the baseline's is; "n/a (both at the top of the
    range)" when both are (their ratio is unknown)."""
    num = f"{gain_pct:+.1f}{unit}"
    if cand == AT_TOP and base == AT_TOP:
        return "n/a (both at the top of the range)"
    if cand == AT_TOP:
        return f"≥ {num}"
    if base == AT_TOP:
        return f"≤ {num}"
    return num


def widen_hint(best: Capacity | None, capacity_high: float) -> str | None:
    """The line that suggests widening the range when the best config's capacity is at its
    top (None otherwise): the config key and a value, twice the current top."""
    if best is None or best.status != AT_TOP:
        return None
    return (
        f"widen the range: the best config holds its SLOs at the top load tried, so its "
        f"capacity is only known to be {best.text()}; set strategy.capacity_high: "
        f"{2 * capacity_high:g} (2x) in the study's config to measure how far it goes"
    )
