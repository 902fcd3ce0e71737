"""The validation phase's one early look (pure; docs/tuning.md#7-validation, "Stopping
early"): once a share of the repeats is done, the phase stops when the runs so far already
name the config it would recommend and no other candidate could overtake it.

The look is a second test of the same question, so the phase's error rate is split between
its two looks (Bonferroni): the early look judges at ``1 - (1 - confidence) / 2``, and the
reported interval is the runs' own at the phase's confidence, as wide as its fewer pairs make
it. Stopping only on a "recommend" whose interval clears every rival keeps the verdicts that
need more runs (a gain near the noise, two close candidates, "keep") running to the end. The
over-length limit is judged on a config's repeats pooled, so a rate near the limit can cross
it with more samples: the recommended config's and the baseline's pooled rates must lie below
the limit by their one-sided upper bound at the look's confidence (Wilson's score bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from autotune.store import RepeatRecord
from autotune.tuning.measure.interval import ValidationSummary
from autotune.tuning.measure.validation_plan import block_size

__all__ = [
    "LOOK_SHARE",
    "MIN_LOOK",
    "look_after",
    "look_confidence",
    "overlength_bound",
    "settled_early",
]

# the share of the repeats done at the early look, and the fewest repeats it looks at (two
# pairs' t-interval spans 12.7 standard deviations at 95 %: too wide to settle anything)
LOOK_SHARE = 0.6
MIN_LOOK = 3


def look_after(repeats: int) -> int | None:
    """Repeats done when the phase looks early: the first round boundary (a multiple of the
    block size, so every config has as many runs) at or past LOOK_SHARE of ``repeats`` and
    MIN_LOOK; None when that leaves no repeat to save."""
    size = block_size(repeats)
    k = size * math.ceil(max(MIN_LOOK, LOOK_SHARE * repeats) / size)
    return k if k < repeats else None


def look_confidence(confidence: float) -> float:
    """The early look's confidence: the phase's error split between its two looks."""
    return 1.0 - (1.0 - confidence) / 2.0


def overlength_bound(runs: Sequence[RepeatRecord], confidence: float) -> float | None:
    """The one-sided upper bound at ``confidence`` of the share of requests ``runs`` cut for
    over-length, pooled (Wilson's score bound); None when no run counted its requests."""
    n = sum(r.requests or 0 for r in runs if r.overlength_rate is not None)
    if n <= 0:
        return None
    p = sum((r.overlength_rate or 0.0) * (r.requests or 0) for r in runs) / n
    z = NormalDist().inv_cdf(confidence)
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / (1 + z * z / n)


def settled_early(
    s: ValidationSummary, runs: Sequence[RepeatRecord], max_overlength_rate: float
) -> bool:
    """The early look's summary (at :func:`look_confidence`) recommends a candidate whose
    interval's lower bound lies above every other candidate's upper bound, every other
    candidate that held its SLOs in every run so far has an interval to compare, and the
    recommended config's and the baseline's over-length rates over ``runs`` stay below
    ``max_overlength_rate`` by their upper bounds."""
    if s.verdict != "recommend" or s.chosen is None:
        return False
    for trial in (s.chosen, s.baseline_trial):
        bound = overlength_bound([r for r in runs if r.trial_number == trial], s.confidence)
        if bound is None or bound > max_overlength_rate:
            return False
    top = s.candidate(s.chosen)
    if top is None or top.interval is None or not math.isfinite(top.interval.low):
        return False
    for c in s.candidates:
        if c.trial_number == s.chosen:
            continue
        if c.interval is None:
            if c.slo_held == c.runs:
                return False  # held every run yet unpaired: nothing says it cannot win
            continue
        if c.interval.high >= top.interval.low:
            return False
    return True
