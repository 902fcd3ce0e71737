"""Scoring (pure): per-level feasibility, normalized constraint margins, the violations in
words, and the trial's objective.

Constraint values are normalized margins, positive = violated (Optuna's convention for
``trial.set_constraint``): ``(p99 - slo) / slo`` for latency SLOs, ``rate - limit`` for error
and over-length rates (defined once, in :mod:`autotune.loadgen.level`). An infeasible
trial whose level's verdict point is known reports the share of that level still to be sent
then instead (:attr:`LevelScore.sampler_margins`). A worker that fails
to start scores objective 0 with every constraint at +1, as a COMPLETE trial, so samplers
learn the region is infeasible (a FAIL is ignored).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.loadgen.client_limit import BOUNDS as CLIENT_BOUNDS
from autotune.loadgen.client_limit import ClientLimit, describe
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stop_rule import StopRule
from autotune.loadgen.stopped import StopInfo, certain_rate
from autotune.loadgen.verdict_point import VerdictAt
from autotune.store.records import TrialRecord
from autotune.tuning.measure.capacity import CapacityResult

__all__ = [
    "CONSTRAINT_NAMES",
    "LevelScore",
    "Slo",
    "TrialScore",
    "Violation",
    "binding_slo",
    "failed_trial_score",
    "format_violation",
    "record_rank",
    "score_level",
    "score_trial",
    "trial_rank",
    "worst_margin_of",
    "worst_slo_margin",
]

CONSTRAINT_NAMES = ("p99_ttft", "p99_tpot", "error_rate", "overlength_rate")


class Slo(StopRule):
    """A study's SLOs, the limits a level's verdict is judged by: the load generator's
    :class:`StopRule` record (its four fields and ``Slo.of(cfg.slo)``), not a copy of it.
    The record lives in ``loadgen`` because the load generator stops a level by the same
    limits and cannot import tuning (docs/architecture.md); the subclass only names it for
    the verdicts (a ``Slo`` compares equal to a ``Slo``, never to a bare ``StopRule``)."""


@dataclass(frozen=True)
class Violation:
    """One constraint a level broke: the measured value beside its limit."""

    name: str  # a constraint name (CONSTRAINT_NAMES, "preemptions") or "completed"
    value: float | None  # None: nothing measured
    limit: float
    bound: bool = False  # value is a lower bound (a stopped level's, loadgen.stopped)

    @property
    def text(self) -> str:
        return format_violation(self)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "text": self.text,
        }
        return d | {"bound": True} if self.bound else d


def _num(x: float, other: float, unit: str, least: int = 0) -> str:
    """``x`` with just enough digits to differ from ``other`` (58 ms > 50 ms, 45.2 > 45)."""
    for digits in range(least, 4):
        a, b = f"{x:,.{digits}f}", f"{other:,.{digits}f}"
        if a != b:
            break
    return a + unit


def _limit(x: float, unit: str) -> str:
    """A limit as written in a config: no trailing zeros (45 ms, 0.5 %)."""
    return f"{x:,.3f}".rstrip("0").rstrip(".") + unit


def _pct(x: float, limit: float) -> str:
    return f"{_num(100.0 * x, 100.0 * limit, ' %', 1)} > {_limit(100.0 * limit, ' %')}"


def format_violation(v: Violation) -> str:
    """E.g. ``p99 TPOT 58 ms > 50 ms``, ``over-length 1.9 % > 1 %``; a lower bound (a stopped
    level's) reads ``p99 TTFT ≥ 3,117 ms > 3,000 ms``."""
    lim = v.limit
    if v.name in CLIENT_BOUNDS and v.value is not None:  # worded by its owner
        return f"client-limited: {describe(v.name, v.value, lim)}"
    if v.name == "completed":
        return "no request completed"
    if v.value is None:
        label = {"p99_ttft": "p99 TTFT", "p99_tpot": "p99 TPOT"}.get(v.name, v.name)
        return f"{label} not measured (SLO {_limit(lim, ' ms')})"
    x = v.value
    ge = "≥ " if v.bound else ""
    if v.name in ("p99_ttft", "p99_tpot"):
        label = "p99 TTFT" if v.name == "p99_ttft" else "p99 TPOT"
        return f"{label} {ge}{_num(x, lim, ' ms')} > {_limit(lim, ' ms')}"
    if v.name == "error_rate":
        return f"errors {ge}{_pct(x, lim)}"
    if v.name == "overlength_rate":
        return f"over-length {ge}{_pct(x, lim)}"
    if v.name == "preemptions":
        return f"preemptions {x:,.0f} > 0"
    return f"{v.name} {x:g} > {lim:g}"


@dataclass(frozen=True)
class LevelScore:
    scale: float
    violations: dict[str, float]  # normalized margins, positive = violated
    feasible: bool
    output_throughput: float
    broken: tuple[Violation, ...] = ()  # what made the level infeasible, in words
    # the client could not drive the level: never feasible, and no verdict rests on it
    # (score_trial and the capacity search skip it; docs/loadgen.md#5-client-limited-levels)
    client_limit: ClientLimit | None = None
    # an infeasible level's point where its verdict became certain (None: not known)
    verdict: VerdictAt | None = None

    @property
    def sampler_margins(self) -> dict[str, float]:
        """The margins the sampler is told when this level speaks for an infeasible trial
        (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees"): with a known
        verdict point, the broken SLO's margin is the share of the level still to be sent
        when its verdict came, and every other margin at most 0. Those come from the replay
        up to that point alone, so early stop changes none of them; the figures of a
        stopped level's partial replay would (its p99 bound lies just past the SLO however
        far off the config is). Otherwise the figures' margins."""
        pt = self.verdict
        if self.feasible or pt is None or pt.reason not in self.violations:
            return dict(self.violations)
        out = {k: min(x, 0.0) for k, x in self.violations.items()}
        out[pt.reason] = pt.share_left
        return out

    @property
    def texts(self) -> list[str]:
        return [v.text for v in self.broken]


@dataclass(frozen=True)
class TrialScore:
    objective: float
    constraints: dict[str, float]
    feasible: bool
    capacity_scale: float | None = None
    levels: tuple[LevelScore, ...] = field(default_factory=tuple)
    capacity: CapacityResult | None = None  # slo-capacity: how the lattice search ended

    @property
    def settled_below(self) -> float | None:
        """Settled (docs/tuning.md#14-settling-losing-trials): the load scale it failed to
        hold; its capacity is below it, and it is neither feasible nor infeasible."""
        c = self.capacity
        return c.below if c is not None and c.status == "settled" else None


def score_level(
    m: LevelMetrics,
    slo: Slo,
    scale: float = 1.0,
    *,
    latency_slos: bool = True,
    preemption_constraint: bool = False,
) -> LevelScore:
    """Feasible iff p99 TTFT <= SLO, p99 TPOT <= SLO, error rate <= limit and over-length
    rate <= limit (all inclusive), with at least one completed request."""
    # Every trial reports the same four constraint names (unused ones at -1, always met), so
    # the sampler compares like with like.
    v: dict[str, float] = {}
    broken: list[Violation] = []
    for name, value, target in (
        ("p99_ttft", m.p99_ttft_ms, slo.p99_ttft_ms),
        ("p99_tpot", m.p99_tpot_ms, slo.p99_tpot_ms),
    ):
        if target is None or not latency_slos:
            v[name] = -1.0
        elif value is None or math.isnan(value) or m.completed == 0:
            v[name] = 1.0  # nothing measured: cannot claim the SLO holds
            if m.completed > 0:
                broken.append(Violation(name, None, target))
        else:
            v[name] = (value - target) / target
            if v[name] > 0:
                broken.append(Violation(name, value, target))
    total = m.total
    err = m.error_rate if total else 1.0
    v["error_rate"] = err - slo.max_error_rate
    if v["error_rate"] > 0 and total:
        broken.append(Violation("error_rate", err, slo.max_error_rate))
    v["overlength_rate"] = m.overlength_rate - slo.max_overlength_rate
    if v["overlength_rate"] > 0:
        broken.append(Violation("overlength_rate", m.overlength_rate, slo.max_overlength_rate))
    if preemption_constraint:  # opt-in: any preemption violates (by the server's counter)
        pre = float(m.num_preemptions or 0)
        v["preemptions"] = 1.0 if pre > 0 else -1.0
        if pre > 0:
            broken.append(Violation("preemptions", pre, 0.0))
    if m.completed == 0:
        broken.insert(0, Violation("completed", 0.0, 1.0))
    feasible = m.completed > 0 and all(x <= 0 for x in v.values())
    stop = m.stop
    if stop is not None:
        # the margins stay the figures' (the sampler's view of the trial, unchanged); the
        # words say only what the stop made certain (docs/tuning.md#10-early-stop-inside-a-level)
        seen = [b for b in broken if b.name == "preemptions"]  # certain once counted
        broken = [*_certain(m, slo, stop, latency_slos), *seen]
    cl = m.client_limit
    if cl is not None:  # the figures are the client's: they cannot show the SLOs held
        feasible = False
        broken.insert(0, Violation(cl.bound, cl.value_ms, cl.limit_ms))
    pt = None if feasible else m.verdict
    return LevelScore(scale, v, feasible, m.output_throughput, tuple(broken), cl, pt)


def _certain(m: LevelMetrics, slo: Slo, stop: StopInfo, latency_slos: bool) -> list[Violation]:
    """What a stopped level already breaks whatever its unsent requests would have done: the
    SLO it stopped on, and a rate whose count among the requests sent exceeds what the limit
    allows over the whole level (its value then ``count / planned``, a lower bound)."""
    out: list[Violation] = []
    for name, value, target in (
        ("p99_ttft", m.p99_ttft_ms, slo.p99_ttft_ms),
        ("p99_tpot", m.p99_tpot_ms, slo.p99_tpot_ms),
    ):
        if name != stop.reason or target is None or not latency_slos:
            continue
        # by the rule's bound it is (docs/tuning.md#10-early-stop-inside-a-level)
        if value is None or value > target:
            bound = stop.bound_figure == f"{name}_ms"
            out.append(Violation(name, value, target, bound and value is not None))
    for name, count, limit in (
        ("error_rate", m.errors, slo.max_error_rate),
        ("overlength_rate", m.over_length + m.truncated, slo.max_overlength_rate),
    ):
        at_least = certain_rate(count, stop.planned, limit)
        if at_least is None and name == stop.reason:  # the rule counted what the records do
            at_least = count / max(stop.planned, 1)
        if at_least is not None:
            out.append(Violation(name, at_least, limit, True))
    return out


def score_trial(levels: Sequence[LevelScore], capacity: CapacityResult | None = None) -> TrialScore:
    """The objective is output tokens/s at the trial's capacity: the lattice point the
    capacity search settled on (slo-capacity), else the highest-load feasible level (one
    level for fixed-rate and offline). With no feasible level, the constraints are the
    least-violated level's sampler margins (:attr:`LevelScore.sampler_margins`), so the
    sampler sees how far off the trial was. Client-limited
    levels count for neither: their figures are the client's."""
    if not levels:
        return failed_trial_score()
    usable = [lv for lv in levels if lv.client_limit is None]
    if not usable:
        return dataclasses.replace(failed_trial_score(), levels=tuple(levels), capacity=capacity)
    feasible = [lv for lv in usable if lv.feasible]
    best: LevelScore | None = None
    if capacity is not None:
        if capacity.scale is not None:
            at = [lv for lv in feasible if math.isclose(lv.scale, capacity.scale, rel_tol=1e-9)]
            best = at[0] if at else None
    elif feasible:
        best = max(feasible, key=lambda lv: (lv.scale, lv.output_throughput))
    if best is not None:
        return TrialScore(
            best.output_throughput,
            dict(best.violations),
            True,
            best.scale,
            tuple(levels),
            capacity,
        )
    closest = min(usable, key=lambda lv: max(lv.sampler_margins.values()))
    return TrialScore(0.0, closest.sampler_margins, False, None, tuple(levels), capacity)


def failed_trial_score(names: Sequence[str] = CONSTRAINT_NAMES) -> TrialScore:
    return TrialScore(0.0, {n: 1.0 for n in names}, False, None, ())


def worst_slo_margin(m: LevelMetrics, slo: Slo) -> float | None:
    """The worst latency margin of a level: the largest p99 / SLO over the latency SLOs the
    study sets (p99 TTFT, p99 TPOT); lower is better, above 1 violates. None when no latency
    SLO is set or a set one was not measured (fixed-rate's gain,
    docs/tuning.md#7-validation)."""
    if m.completed == 0:
        return None
    return worst_margin_of(m.p99_ttft_ms, m.p99_tpot_ms, slo)


def worst_margin_of(p99_ttft_ms: float | None, p99_tpot_ms: float | None, slo: Slo) -> float | None:
    """The largest p99 / SLO over the latency SLOs that are set (None: none is set, or a set
    one was not measured)."""
    ratios = []
    for value, target in ((p99_ttft_ms, slo.p99_ttft_ms), (p99_tpot_ms, slo.p99_tpot_ms)):
        if target is None:
            continue
        if value is None or math.isnan(value):
            return None
        ratios.append(value / target)
    return max(ratios) if ratios else None


def binding_slo(p99_ttft_ms: float | None, p99_tpot_ms: float | None, slo: Slo) -> str | None:
    """The latency SLO nearest its limit (``p99_ttft`` or ``p99_tpot``, the larger p99 / SLO;
    TTFT on a tie), or None unless both are set and measured: at a trial's capacity, the one
    that breaks first as load grows."""
    if slo.p99_ttft_ms is None or slo.p99_tpot_ms is None:
        return None
    if p99_ttft_ms is None or p99_tpot_ms is None or math.isnan(p99_ttft_ms + p99_tpot_ms):
        return None
    tpot = p99_tpot_ms / slo.p99_tpot_ms > p99_ttft_ms / slo.p99_ttft_ms
    return "p99_tpot" if tpot else "p99_ttft"


def trial_rank(
    mode: str,
    slo: Slo,
    objective: float | None,
    p99_ttft_ms: float | None,
    p99_tpot_ms: float | None,
) -> tuple[float, float]:
    """How trials of a mode compare, higher is better
    (docs/tuning.md#9-the-fixed-rate-objective). ``fixed-rate``: every feasible trial
    serves the offered rate, so throughput only measures noise; the worst SLO margin ranks
    them (its headroom ``1 / margin``, so higher is better) and throughput breaks ties.
    Other modes: the objective."""
    obj = objective or 0.0
    if mode != "fixed-rate":
        return (obj, 0.0)
    margin = worst_margin_of(p99_ttft_ms, p99_tpot_ms, slo)
    if margin is None or margin <= 0:
        return (0.0, obj)  # no latency SLO set: throughput alone
    return (1.0 / margin, obj)


def record_rank(mode: str, slo: Slo, t: TrialRecord) -> tuple[float, float]:
    """:func:`trial_rank` of a stored trial (its headline level's p99s)."""
    top = t.headline_level()
    return trial_rank(
        mode, slo, t.objective, top.p99_ttft_ms if top else None, top.p99_tpot_ms if top else None
    )
