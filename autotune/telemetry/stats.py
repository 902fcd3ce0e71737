"""Value types of a level summary and the statistics behind them (pure).

Histogram quantiles are interpolated inside vLLM's buckets (the smallest queue/e2e bucket is
0.3 s, vllm.md §6.3), so they are labeled coarse and server-side wherever they are shown.
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
    "BudgetUse",
    "GaugeStats",
    "HistogramDelta",
    "Series",
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
        return {"count": self.count, "sum": self.sum, "mean": self.mean,
                "buckets": [["+Inf" if math.isinf(le) else le, n] for le, n in self.buckets],
                "coarse_quantiles": {f"p{round(q * 100)}": self.quantile(q) for q in QUANTILES},
                "quantiles_note": "server-side, interpolated inside histogram buckets (coarse)"}

    @staticmethod
    def between(before: HistogramData | None, after: HistogramData) -> HistogramDelta:
        """``after - before``; a count that went down means a restart: ``after`` alone."""
        if before is None or after.count < before.count:
            return HistogramDelta(after.buckets, after.sum, after.count)
        old = dict(before.buckets)
        return HistogramDelta(tuple((le, n - old.get(le, 0.0)) for le, n in after.buckets),
                              after.sum - before.sum, after.count - before.count)


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
        return BudgetUse(budget, hist.count, mean, mean / budget,
                         (hist.count - below) / hist.count, lower)


def gauge_stats(t: Series, v: Series, end: float) -> GaugeStats | None:
    """Max, mean and time-weighted mean of samples ``v`` taken at ascending times ``t``."""
    if len(v) == 0:
        return None
    ta, va = np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)
    w = np.diff(np.append(ta, max(end, float(ta[-1]))))
    twm = float((w * va).sum() / w.sum()) if w.sum() > 0 else float(va.mean())
    return GaugeStats(len(va), float(va.max()), float(va.mean()), twm)


def saturated_fraction(t: Series, running: Series, waiting: Series,
                       end: float, max_num_seqs: int | None) -> float | None:
    """Time share of samples with ``running >= max_num_seqs`` and ``waiting > 0``."""
    if max_num_seqs is None or len(running) == 0:
        return None
    ta = np.asarray(t, dtype=np.float64)
    hit = (np.asarray(running) >= max_num_seqs) & (np.asarray(waiting) > 0)
    w = np.diff(np.append(ta, max(end, float(ta[-1]))))
    return float((w * hit).sum() / w.sum()) if w.sum() > 0 else float(hit.mean())


def histogram_of(values: Series, bounds: Sequence[float]) -> HistogramDelta:
    """Observations -> cumulative buckets, ``le`` inclusive as prometheus_client counts them."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    edges = [*map(float, bounds), math.inf]
    cum = np.searchsorted(v, edges, side="right")
    return HistogramDelta(tuple((le, float(c)) for le, c in zip(edges, cum, strict=True)),
                          float(v.sum()), float(len(v)))
