"""Student's t distribution: the two-sided probability and its quantile (pure), for the
validation intervals of :mod:`autotune.tuning.measure.interval` (docs/tuning.md#7-validation)."""

from __future__ import annotations

import math

__all__ = ["t_quantile", "t_two_sided"]


def t_two_sided(t: float, df: int) -> float:
    """P(-t < T < t) for Student's t with ``df`` (>= 1, integer) degrees of freedom: the
    finite series of Abramowitz & Stegun 26.7.3-4, exact for integer ``df``."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return min(1.0, s * total)
    if df == 1:
        return 2.0 * theta / math.pi
    term = math.cos(theta)
    total = term
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return min(1.0, 2.0 / math.pi * (theta + s * total))


def t_quantile(confidence: float, df: int) -> float:
    """The t with ``P(-t < T < t) = confidence`` (e.g. 4.303 for 95 % and 2 df)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < confidence:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)
