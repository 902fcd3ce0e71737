"""Value types of a level summary and the statistics behind them (pure).

Histogram quantiles are interpolated inside vLLM's buckets (the smallest queue/e2e bucket is
0.3 s, docs/vllm.md#63-histogram-buckets), so they are labeled coarse and server-side wherever
they are shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from autotune.telemetry.scrape import HistogramData

__all__ = [
    "QUANTILES",
    "SERIES_BINS",
    "BudgetUse",
    "GaugeStats",
    "HistogramDelta",
    "Series",
    "downsample",
    "gauge_stats",
    "histogram_of",
    "saturated_fraction",
]

QUANTILES = (0.5, 0.9, 0.99)
Series = Sequence[float] | npt.NDArray[np.generic]


@dataclass(frozen=True)
class HistogramDelta:
    """A histogram's increase over the level: cumulative ``(le, count)``, ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Coarse server-side estimate, as PromQL's ``histogram_quantile`` computes it:
        linear inside the bucket, the highest finite bound when it falls in ``+Inf``."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.buckets[-1][1]
        lower, below = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if math.isinf(le):
                    return lower
                if cum == below:
                    return le
                return lower + (le - lower) * (rank - below) / (cum - below)
            lower, below = le, cum
        return lower

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.sum,
            "mean": self.mean,
            "buckets": [["+Inf" if math.isinf(le) else le, n] for le, n in self.buckets],
            "coarse_quantiles": {f"p{round(q * 100)}": self.quantile(q) for q in QUANTILES},
            "quantiles_note": "server-side, interpolated inside histogram buckets (coarse)",
        }

    @staticmethod
    def between(before: HistogramData | None, after: HistogramData) -> HistogramDelta:
        """``after - before``; a count that went down means a restart: ``after`` alone."""
        if before is None or after.count < before.count:
            return HistogramDelta(after.buckets, after.sum, after.count)
        old = dict(before.buckets)
        return HistogramDelta(
            tuple((le, n - old.get(le, 0.0)) for le, n in after.buckets),
            after.sum - before.sum,
            after.count - before.count,
        )


@dataclass(frozen=True)
class GaugeStats:
    """A gauge over the level's samples. ``time_weighted_mean``: each sample holds until the
    next (the last until the window's end), so a stalled scrape does not skew it."""

    samples: int
    max: float
    mean: float
    time_weighted_mean: float


@dataclass(frozen=True)
class BudgetUse:
    """Engine steps against ``max_num_batched_tokens`` from the iteration-tokens histogram.

    ``near_fraction``: share of steps in the bucket that holds the budget or above, i.e. with
    more than ``near_min_tokens`` tokens (that bucket's lower edge, 50-100 % of the budget with
    power-of-two buckets: coarse). ``utilization``: exact mean tokens per step / budget.
    """

    budget: int
    steps: float
    mean_tokens: float
    utilization: float
    near_fraction: float
    near_min_tokens: float

    @staticmethod
    def of(hist: HistogramDelta | None, budget: int | None) -> BudgetUse | None:
        if hist is None or budget is None or budget <= 0 or hist.count <= 0:
            return None
        lower, below = 0.0, 0.0
        for le, cum in hist.buckets:
            if le >= budget:
                break
            lower, below = le, cum
        mean = hist.sum / hist.count
        return BudgetUse(
            budget, hist.count, mean, mean / budget, (hist.count - below) / hist.count, lower
        )


def _weights(ta: np.ndarray, end: float) -> np.ndarray:
    """How long each sample held: until the next one, the last until ``end``. An unbounded
    ``end`` (a whole simulated run) gives the last sample no weight, not an infinite one,
    which would turn every weighted mean into NaN."""
    last = float(ta[-1])
    stop = max(end, last) if math.isfinite(end) else last
    return np.diff(np.append(ta, stop))


def gauge_stats(t: Series, v: Series, end: float) -> GaugeStats | None:
    """Max, mean and time-weighted mean of samples ``v`` taken at ascending times ``t``."""
    if len(v) == 0:
        return None
    ta, va = np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)
    w = _weights(ta, end)
    twm = float((w * va).sum() / w.sum()) if w.sum() > 0 else float(va.mean())
    return GaugeStats(len(va), float(va.max()), float(va.mean()), twm)


def saturated_fraction(
    t: Series, running: Series, waiting: Series, end: float, max_num_seqs: int | None
) -> float | None:
    """Time share of samples with ``running >= max_num_seqs`` and ``waiting > 0``."""
    if max_num_seqs is None or len(running) == 0:
        return None
    ta = np.asarray(t, dtype=np.float64)
    hit = (np.asarray(running) >= max_num_seqs) & (np.asarray(waiting) > 0)
    w = _weights(ta, end)
    return float((w * hit).sum() / w.sum()) if w.sum() > 0 else float(hit.mean())


def histogram_of(values: Series, bounds: Sequence[float]) -> HistogramDelta:
    """Observations -> cumulative buckets, ``le`` inclusive as prometheus_client counts them."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    edges = [*map(float, bounds), math.inf]
    cum = np.searchsorted(v, edges, side="right")
    return HistogramDelta(
        tuple((le, float(c)) for le, c in zip(edges, cum, strict=True)),
        float(v.sum()),
        float(len(v)),
    )


SERIES_BINS = 60  # points kept per level: enough to see queues build, small in the database
_SERIES_DIGITS = {"kv_usage": 4}  # a share (0-1); counts and seconds keep one decimal


def downsample(
    t: Series, series: dict[str, Series], start: float, *, bins: int = SERIES_BINS
) -> dict[str, list[float]] | None:
    """A level's gauge samples as at most ``bins`` points over its time: ``t`` (seconds since
    ``start``, the mean sample time in each bin), each series' sample mean per bin, and
    ``preemptions`` (a counter, given relative to the level's start) as its last value in the
    bin. Bins without samples are left out. None without samples."""
    ta = np.asarray(t, dtype=np.float64)
    if len(ta) == 0:
        return None
    t0 = start if math.isfinite(start) and start <= ta[0] else float(ta[0])
    span = max(float(ta[-1]) - t0, 1e-9)
    idx = np.minimum(((ta - t0) / span * bins).astype(np.int64), bins - 1)
    counts = np.bincount(idx, minlength=bins)
    used = np.flatnonzero(counts)

    def means(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return (np.bincount(idx, weights=v, minlength=bins) / np.maximum(counts, 1))[used]

    out: dict[str, list[float]] = {"t": [round(float(x), 2) for x in means(ta - t0)]}
    last_of_bin = np.searchsorted(idx, used, side="right") - 1  # idx ascends with t
    for name, values in series.items():
        va = np.asarray(values, dtype=np.float64)
        if len(va) != len(ta):
            continue
        vals = va[last_of_bin] if name == "preemptions" else means(va)
        digits = _SERIES_DIGITS.get(name, 1)
        out[name] = [round(float(x), digits) for x in vals]
    return out
