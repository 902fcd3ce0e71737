"""Scoring (pure): per-level feasibility, normalized constraint margins, the objective, and
the bracketed search for the highest load that meets the SLOs.

Constraint values are normalized margins, positive = violated (Optuna's convention for
``trial.set_constraint``): ``(p99 - slo) / slo`` for latency SLOs, ``rate - limit`` for error
and over-length rates. A worker that fails to start scores objective 0 with every constraint
at +1, as a COMPLETE trial, so samplers learn the region is infeasible (a FAIL is ignored).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.config import SloConfig

__all__ = [
    "CONSTRAINT_NAMES",
    "LevelScore",
    "Slo",
    "TrialScore",
    "failed_trial_score",
    "next_scale",
    "score_level",
    "score_trial",
]

CONSTRAINT_NAMES = ("p99_ttft", "p99_tpot", "error_rate", "overlength_rate")


@dataclass(frozen=True)
class Slo:
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    max_error_rate: float = 0.0
    max_overlength_rate: float = 0.01

    @classmethod
    def of(cls, s: SloConfig) -> Slo:
        """The SLOs a study config states."""
        return cls(s.p99_ttft_ms, s.p99_tpot_ms, s.max_error_rate, s.max_overlength_rate)


@dataclass(frozen=True)
class LevelScore:
    scale: float
    violations: dict[str, float]
    feasible: bool
    output_throughput: float


@dataclass(frozen=True)
class TrialScore:
    objective: float
    constraints: dict[str, float]
    feasible: bool
    capacity_scale: float | None = None
    levels: tuple[LevelScore, ...] = field(default_factory=tuple)


def score_level(metrics: Mapping[str, float | int | None], slo: Slo, scale: float = 1.0, *,
                latency_slos: bool = True, preemption_constraint: bool = False) -> LevelScore:
    """Feasible iff p99 TTFT <= SLO, p99 TPOT <= SLO, error rate <= limit and over-length
    rejections <= limit (all inclusive). ``metrics`` uses ``vllm bench serve``'s keys."""
    total = int(metrics.get("completed") or 0) + int(metrics.get("failed") or 0)
    over = int(metrics.get("over_length_rejections") or 0)
    errors = int(metrics.get("failed") or 0) - over
    err_rate = errors / total if total else 1.0
    # requests max_model_len did not fit: refused (prompt too long) or served cut short
    too_long = over + int(metrics.get("truncated_requests") or 0)
    over_rate = too_long / total if total else 0.0
    # Every trial reports the same four constraint names (unused ones at -1, always met), so
    # the sampler compares like with like.
    v: dict[str, float] = {}
    for name, key, target in (("p99_ttft", "p99_ttft_ms", slo.p99_ttft_ms),
                              ("p99_tpot", "p99_tpot_ms", slo.p99_tpot_ms)):
        if target is None or not latency_slos:
            v[name] = -1.0
        else:
            value = metrics.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                v[name] = 1.0  # nothing measured: cannot claim the SLO holds
            else:
                v[name] = (float(value) - target) / target
    v["error_rate"] = err_rate - slo.max_error_rate
    v["overlength_rate"] = over_rate - slo.max_overlength_rate
    if preemption_constraint:  # opt-in: any preemption violates (by the server's counter)
        v["preemptions"] = 1.0 if float(metrics.get("num_preemptions") or 0) > 0 else -1.0
    completed = int(metrics.get("completed") or 0)
    feasible = completed > 0 and all(x <= 0 for x in v.values())
    return LevelScore(scale, v, feasible, float(metrics.get("output_throughput") or 0.0))


def score_trial(levels: Sequence[LevelScore]) -> TrialScore:
    """The objective is output tokens/s at the highest-load feasible level (slo-capacity; a
    single level for fixed-rate and offline). With no feasible level, the constraints are the
    least-violated level's, so the sampler sees how far off the trial was."""
    if not levels:
        return failed_trial_score()
    feasible = [lv for lv in levels if lv.feasible]
    if feasible:
        best = max(feasible, key=lambda lv: (lv.scale, lv.output_throughput))
        return TrialScore(best.output_throughput, dict(best.violations), True, best.scale,
                          tuple(levels))
    closest = min(levels, key=lambda lv: max(lv.violations.values()))
    return TrialScore(0.0, dict(closest.violations), False, None, tuple(levels))


def failed_trial_score(names: Sequence[str] = CONSTRAINT_NAMES) -> TrialScore:
    return TrialScore(0.0, {n: 1.0 for n in names}, False, None, ())


def next_scale(history: Sequence[tuple[float, bool]], *, low: float, high: float,
               budget: int, start: float = 1.0) -> float | None:
    """The next load scale to try, or None when done.

    Bracketing: start at ``start``; double while feasible (up to ``high``), halve while
    infeasible (down to ``low``); once bracketed, bisect geometrically between the highest
    feasible and the lowest infeasible scale. ``budget`` caps the number of levels.
    """
    if not history:
        return min(max(start, low), high)
    if len(history) >= budget:
        return None
    ok = [s for s, f in history if f]
    bad = [s for s, f in history if not f]
    hi_ok = max(ok) if ok else None
    lo_bad = min(bad) if bad else None
    if hi_ok is not None and lo_bad is not None and hi_ok < lo_bad:
        if lo_bad / hi_ok < 1.05:
            return None  # bracketed within 5 %
        return math.sqrt(hi_ok * lo_bad)
    if lo_bad is None:  # all feasible so far
        assert hi_ok is not None
        return None if hi_ok >= high else min(hi_ok * 2, high)
    if hi_ok is None:  # nothing feasible yet
        return None if lo_bad <= low else max(lo_bad / 2, low)
    return None  # inconsistent history (noise): stop and report what is known
