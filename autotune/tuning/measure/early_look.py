"""The validation phase's one early look (pure; docs/tuning.md#7-validation, "Stopping
early"): once a share of the repeats is done, the phase stops when the runs so far already
name the config it would recommend and no other candidate could overtake it.

The look is a second test of the same question, so the phase's error rate is split between
its two looks (Bonferroni): the early look judges at ``1 - (1 - confidence) / 2``, and the
reported interval is the runs' own at the phase's confidence, as wide as its fewer pairs make
it. Stopping only on a "recommend" whose interval clears every rival keeps the verdicts that
need more runs (a gain near the noise, "keep") running to the end. A rival is no obstacle
when it cannot be recommended (a run of it broke the SLOs, and every run must hold them) or
when it measured no higher than the recommended config on every sample both ran: paired on
the same samples, it never led; or when it is tied with the recommended config: it beats the
baseline too, at the look's confidence and beyond the noise band, and its mean gain lies
within the recommended config's interval, so either would be recommended and more runs would
only choose between two configs the runs cannot tell apart (docs/tuning.md#7-validation,
"Stopping early").

The over-length limit is judged on a config's repeats pooled, so a rate near the limit can
cross it with more samples: the recommended config's and the baseline's pooled rates must lie
below the limit by their one-sided upper bound at the look's confidence (Wilson's score
bound), unless the rate over every planned run is already known. What ``max_model_len`` cuts
depends only on the lengths drawn, and every run's sample is drawn before it runs: when each
finished run of a config measured exactly what its sample's lengths predict, the pending runs'
rates are their samples' (:func:`final_overlength`), and the pooled rate the phase will judge
is known now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist

from autotune.failures import ARGS_CANNOT_START
from autotune.store import RepeatRecord
from autotune.tuning.measure.interval import CandidateSummary, ValidationSummary, runs_of
from autotune.tuning.measure.validation_plan import block_size

__all__ = [
    "LOOK_SHARE",
    "LOOK_VERDICTS",
    "MIN_LOOK",
    "baseline_never_serves",
    "final_overlength",
    "look_after",
    "look_confidence",
    "never_led",
    "overlength_bound",
    "passed_over",
    "settled_early",
    "tied",
    "tied_with",
]

# the verdicts the look can stop on (settled_early says when)
LOOK_VERDICTS = ("recommend", "no-baseline")
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


def final_overlength(
    runs: Sequence[RepeatRecord], predict: Callable[[RepeatRecord], tuple[float, int] | None]
) -> dict[int, float]:
    """Each config's pooled over-length rate over all its planned ``runs`` (finished and
    pending), by trial number, where it is known before the pending ones run: ``predict(run)``
    gives the rate its sample's lengths predict and the sample's size (None: unknown), and
    every finished run of the config measured exactly that rate over the same whole number
    of copies of its sample (a server of k devices is offered k copies,
    docs/tuning.md#16-the-parallelism-stage), which its pending runs are then offered too. A
    config with any other run is left out: its rate is not known yet."""
    by: dict[int, list[RepeatRecord]] = {}
    for r in runs:
        by.setdefault(r.trial_number, []).append(r)
    out: dict[int, float] = {}
    for trial, rs in by.items():
        shares = [(r, predict(r)) for r in rs]
        copies = {
            r.requests // p[1] if p is not None and p[1] > 0 and r.requests % p[1] == 0 else 0
            for r, p in shares
            if r.state == "COMPLETE"
        }
        if len(copies) != 1 or 0 in copies:
            continue  # no finished run, a partial copy, or runs offered different copies
        cut = sent = 0.0
        for r, p in shares:
            if p is None or (
                r.state == "COMPLETE"
                and (r.overlength_rate is None or abs(r.overlength_rate - p[0]) > 1e-12)
            ):
                break  # unknown, or this server did not cut what the lengths predict
            cut, sent = cut + p[0] * p[1], sent + p[1]
        else:
            if sent > 0:
                out[trial] = cut / sent
    return out


def never_led(mode: str, rival: int, chosen: int, runs: Sequence[RepeatRecord]) -> bool:
    """On every repeat where ``rival`` held its SLOs, ``chosen`` held them too and measured at
    least its figure (the mode's, :func:`runs_of`), with at least two such repeats."""

    def figures(trial: int) -> dict[int, float | None]:
        return {r.repeat: r.figure for r in runs_of(mode, runs) if r.trial_number == trial}

    theirs, ours = figures(rival), figures(chosen)
    held = {k: v for k, v in theirs.items() if v is not None}
    if len(held) < 2:
        return False
    for k, v in held.items():
        mine = ours.get(k)
        if mine is None or mine < v * (1 - 1e-12):
            return False
    return True


def tied(rival: CandidateSummary, top: CandidateSummary, band_pct: float | None) -> bool:
    """``rival`` beats the baseline as ``top`` does (its interval's lower bound above 0 and
    its mean gain beyond the noise band, the bar a recommendation meets) and its mean gain
    lies within ``top``'s interval: the runs show no sign that it gains more than ``top``
    might."""
    a, b = rival.interval, top.interval
    if a is None or b is None or not math.isfinite(a.low) or not math.isfinite(b.high):
        return False
    return a.low > 0 and a.mean > (band_pct or 0.0) and a.mean <= b.high


def settled_early(
    s: ValidationSummary,
    runs: Sequence[RepeatRecord],
    max_overlength_rate: float,
    known_overlength: Mapping[int, float] | None = None,
) -> bool:
    """The early look's summary (at :func:`look_confidence`) recommends a candidate whose
    interval's lower bound lies above every other candidate's upper bound, except a rival
    that cannot be recommended (a run of it broke the SLOs), that never led it
    (:func:`never_led`) or that is tied with it (:func:`tied`); every other candidate that
    held its SLOs in every run so far has an interval to compare; and the recommended
    config's and the baseline's over-length rates stay within ``max_overlength_rate``: by
    their pooled rate over every planned run where ``known_overlength``
    (:func:`final_overlength`) has it, else by the upper bound of their rates over
    ``runs``. A ``no-baseline`` verdict (the baseline broke its SLOs, so no gain decides)
    settles when the baseline can never serve (:func:`baseline_never_serves`), the
    recommended config's over-length rate passes the same test, and every rival that could
    still be recommended never led it."""
    if s.verdict not in LOOK_VERDICTS or s.chosen is None:
        return False
    chosen = s.chosen
    known = known_overlength or {}

    def within(trial: int) -> bool:  # its pooled over-length rate stays within the limit
        if trial in known:
            return known[trial] <= max_overlength_rate + 1e-12
        bound = overlength_bound([r for r in runs if r.trial_number == trial], s.confidence)
        return bound is not None and bound <= max_overlength_rate

    if s.verdict == "no-baseline":
        # a baseline that served some runs pairs with the candidates on the pending ones, and
        # the verdict ranks by those pairs' gains: who leads on figures alone is not the answer
        return (
            baseline_never_serves(s.baseline_trial, runs)
            and within(chosen)
            and all(never_led(s.mode, c.trial_number, chosen, runs) for c in _rivals(s))
        )
    if not (within(chosen) and within(s.baseline_trial)):
        return False
    top = s.candidate(chosen)
    if top is None or top.interval is None or not math.isfinite(top.interval.low):
        return False
    for c in _rivals(s):
        if c.interval is None:
            return False  # held every run yet unpaired: nothing says it cannot win
        if (
            c.interval.high >= top.interval.low
            and not never_led(s.mode, c.trial_number, chosen, runs)
            and not tied(c, top, s.noise_band_pct)
        ):
            return False
    return True


def baseline_never_serves(baseline: int, runs: Sequence[RepeatRecord]) -> bool:
    """Every run of the ``baseline`` so far failed to start for a reason its engine arguments
    decide (:data:`autotune.failures.ARGS_CANNOT_START`): no pending run of it can serve, so
    it pairs with no candidate and the candidates are ranked on their own figures."""
    mine = [r for r in runs if r.trial_number == baseline]
    return bool(mine) and all(r.failure_class in ARGS_CANNOT_START for r in mine)


def _rivals(s: ValidationSummary) -> list[CandidateSummary]:
    """The candidates other than the recommended one that could still be recommended: each
    held the SLOs in every run so far, the study's included (one broken run rules a config
    out, since every run must hold them)."""
    return [
        c
        for c in s.candidates
        if c.trial_number != s.chosen and c.slo_held == c.runs and c.held.study is not False
    ]


def _overlapping(s: ValidationSummary) -> tuple[CandidateSummary | None, list[CandidateSummary]]:
    """The recommended config's summary and the rivals whose intervals overlap its own."""
    top = s.candidate(s.chosen)
    if s.chosen is None or top is None or top.interval is None:
        return None, []
    low = top.interval.low
    return top, [c for c in _rivals(s) if c.interval is not None and c.interval.high >= low]


def passed_over(s: ValidationSummary, runs: Sequence[RepeatRecord]) -> tuple[int, ...]:
    """The rivals a settled look passed over because they never led the recommended config
    (:func:`never_led`): their intervals overlapping its own, or, under a ``no-baseline``
    verdict (no intervals to compare), every rival."""
    if s.chosen is None:
        return ()
    chosen = s.chosen
    over = _rivals(s) if s.verdict == "no-baseline" else _overlapping(s)[1]
    return tuple(c.trial_number for c in over if never_led(s.mode, c.trial_number, chosen, runs))


def tied_with(s: ValidationSummary, runs: Sequence[RepeatRecord]) -> tuple[int, ...]:
    """The rivals a settled look passed over as tied with the recommended config
    (:func:`tied`), those that led it on some shared sample."""
    top, over = _overlapping(s)
    if top is None or s.chosen is None:
        return ()
    return tuple(
        c.trial_number
        for c in over
        if not never_led(s.mode, c.trial_number, s.chosen, runs) and tied(c, top, s.noise_band_pct)
    )
