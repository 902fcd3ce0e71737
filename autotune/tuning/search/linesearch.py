"""One parameter at a time, searched as a line: where a stage's next trial goes (pure).

A staged stage moves one parameter with every other one held (docs/tuning.md#8-the-staged-plan).
With a handful of trials on one axis, a model-based sampler spends several of them on
near-repeats (TPE drew ``max_num_seqs`` 8 twice in one five-trial stage); a line search does
not. It first spreads ``n_coarse`` points over the range (log-spaced for the log-scaled
parameters), then halves the larger gap beyond the plateau of the best points found on the
line (scores within noise of the best), so every trial either maps the line or narrows in on
the edge of its best region. Capacity curves over one of these parameters mostly rise to one
plateau and fall past it, the shape a bracketing search suits. The token budget's can also
rise at its floor, where every step is shortest, past a dip the grid's points fall in; so a
line that found no rise over where it began can try one end (``end``) before narrowing in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["next_on_line"]


def _fwd(x: float, log: bool) -> float:
    return math.log(x) if log else x


def _back(u: float, log: bool) -> float:
    return math.exp(u) if log else u


def _quantize(x: float, lo: float, hi: float, step: float) -> float:
    q = round(round(x / step) * step, 6)
    return min(max(q, lo), hi)


def next_on_line(
    points: Sequence[tuple[float, float | None]],
    lo: float,
    hi: float,
    *,
    log: bool,
    step: float,
    n_coarse: int,
    tol: float = 0.01,
    end: tuple[float, float] | None = None,
) -> float | None:
    """The next value to try, or None when every value worth trying has been tried.

    ``points``: (value, score) of the trials on this line, higher score better (an
    infeasible trial scores below every feasible one; None: still running, tried but not
    known). ``step``: the parameter's granularity (1 for integers). ``tol``: scores within
    this share of the best are a tie (one capacity-lattice step is 1 %). ``end``: (value,
    score): once the grid is mapped, ``value`` comes next, unless tried, when no point on the
    line scores above ``score`` by more than ``tol``."""
    tried = {_quantize(x, lo, hi, step) for x, _ in points}
    ulo, uhi = _fwd(lo, log), _fwd(hi, log)
    if uhi <= ulo:
        return None if lo in tried else lo
    # 1. map the line: interior points of an even grid, skipping any already near a trial
    half = (uhi - ulo) / (2 * max(n_coarse, 1))
    us = [_fwd(max(x, lo), log) for x in tried]
    for i in range(n_coarse):
        u = ulo + (2 * i + 1) * half
        if all(abs(u - v) >= half for v in us):
            x = _quantize(_back(u, log), lo, hi, step)
            if x not in tried:
                return x
    scored = [(x, f) for x, f in points if f is not None]
    if not scored:
        return None
    # 2. narrow in beside the best: points within ``tol`` of the best score are one plateau
    # (their differences are noise), and the larger gap beyond either edge of the plateau is
    # halved next (the range's ends bound it)
    top = max(f for _, f in scored)
    if end is not None and top <= end[1] + tol * abs(end[1]):
        x = _quantize(end[0], lo, hi, step)
        if x not in tried:
            return x
    plateau = [_quantize(x, lo, hi, step) for x, f in scored if f >= top - tol * abs(top)]
    xs = sorted(tried)
    left_edge, right_edge = min(plateau), max(plateau)
    i, j = xs.index(left_edge), xs.index(right_edge)
    left = xs[i - 1] if i > 0 else lo
    right = xs[j + 1] if j + 1 < len(xs) else hi
    ul, ur = _fwd(max(left_edge, lo), log), _fwd(max(right_edge, lo), log)
    sides = sorted(
        (
            (ul - _fwd(max(left, lo), log), (_fwd(max(left, lo), log) + ul) / 2),
            (_fwd(right, log) - ur, (ur + _fwd(right, log)) / 2),
        ),
        key=lambda s: -s[0],
    )
    for gap, mid in sides:
        if gap <= 0:
            continue
        x = _quantize(_back(mid, log), lo, hi, step)
        if x not in tried:
            return x
    return None
