"""One load level's server telemetry, whichever way it was gathered (pure; no I/O).

Three sources feed the same :class:`LevelTelemetry`: direct scrapes of ``/metrics``
(:func:`summarize` / :func:`from_scrape`), the simulated engine's in-process timeline for
``sim-virtual`` trials (:func:`autotune.sim.from_sim_timeline`, on the simulator's side) and
PromQL (``autotune.telemetry.prometheus``).

Counters and histograms are before/after deltas, exact whatever happened in between; gauges
exist only where mid-level samples do. Histogram quantiles are interpolated inside vLLM's
buckets (the smallest queue/e2e bucket is 0.3 s, docs/vllm.md#63-histogram-buckets), so they
are labeled coarse and server-side everywhere they appear; means come from the exact
``_sum``/``_count`` deltas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.telemetry.scrape import LevelScrape, Snapshot
from autotune.telemetry.stats import (
    BudgetUse,
    GaugeStats,
    HistogramDelta,
    Series,
    downsample,
    gauge_stats,
    saturated_fraction,
)

__all__ = [
    "COUNTERS",
    "GAUGES",
    "HISTOGRAMS",
    "SUCCESS",
    "BudgetUse",
    "GaugeStats",
    "HistogramDelta",
    "LevelTelemetry",
    "from_scrape",
    "summarize",
]

# Short keys -> vLLM family names (current spelling; scrape.py maps older ones onto these).
COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
}
SUCCESS = "vllm:request_success"
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
}
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue_time": "vllm:request_queue_time_seconds",
    "iteration_tokens": "vllm:iteration_tokens_total",
}


@dataclass(frozen=True)
class LevelTelemetry:
    """One level's server-side view. ``counters`` and ``request_success`` are empty when the
    before or after snapshot is missing (``has_deltas`` False); ``gauges`` are empty without
    mid-level samples. ``saturated_fraction``: time share with running >= ``max_num_seqs``
    while requests wait (None without samples or cap). ``series``: the gauges and the
    preemption count over the level's time, at most
    :data:`~autotune.telemetry.stats.SERIES_BINS` points (:func:`~autotune.telemetry.stats.
    downsample`; None without mid-level samples), for the report's plots over time."""

    source: str
    window_s: float
    has_deltas: bool
    counters: Mapping[str, float] = field(default_factory=dict)
    request_success: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, GaugeStats] = field(default_factory=dict)
    histograms: Mapping[str, HistogramDelta] = field(default_factory=dict)
    saturated_fraction: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    samples: int = 0
    missed_scrapes: int = 0
    cache_config: Mapping[str, str] | None = None
    series: Mapping[str, list[float]] | None = None

    @property
    def finished(self) -> float:
        return sum(self.request_success.values())

    @property
    def mean_queue_time_s(self) -> float | None:
        """From ``vllm:request_queue_time_seconds`` sum/count deltas (exact, not bucketed)."""
        h = self.histograms.get("queue_time")
        return h.mean if h is not None else None

    @property
    def mean_e2e_s(self) -> float | None:
        h = self.histograms.get("e2e")
        return h.mean if h is not None else None

    def budget_use(self, budget: int | None = None) -> BudgetUse | None:
        return BudgetUse.of(
            self.histograms.get("iteration_tokens"),
            budget if budget is not None else self.max_num_batched_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable (no infinities: ``+Inf`` bounds are the string ``"+Inf"``)."""
        use = self.budget_use()
        return {
            "source": self.source,
            "window_s": self.window_s,
            "has_deltas": self.has_deltas,
            "counters": dict(self.counters),
            "request_success": dict(self.request_success),
            "finished": self.finished,
            "gauges": {k: asdict(g) for k, g in self.gauges.items()},
            "histograms": {k: h.to_dict() for k, h in self.histograms.items()},
            "mean_queue_time_s": self.mean_queue_time_s,
            "mean_e2e_s": self.mean_e2e_s,
            "iteration_tokens": asdict(use) if use is not None else None,
            "saturated_fraction": self.saturated_fraction,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "samples": self.samples,
            "missed_scrapes": self.missed_scrapes,
            "cache_config": dict(self.cache_config) if self.cache_config else None,
            "series": dict(self.series) if self.series else None,
        }


def summarize(
    before: Snapshot | None,
    after: Snapshot | None,
    samples: Sequence[Snapshot] = (),
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    missed: int = 0,
    source: str = "scrape",
) -> LevelTelemetry:
    """A level from its before/after snapshots and the mid-level samples between them."""
    counters: dict[str, float] = {}
    success: dict[str, float] = {}
    hists: dict[str, HistogramDelta] = {}
    if before is not None and after is not None:
        for key, name in COUNTERS.items():
            if name in after.counters:
                counters[key] = _delta(before.counters.get(name), after.counters[name])
        old = before.labeled.get(SUCCESS, {})
        success = {r: _delta(old.get(r), v) for r, v in after.labeled.get(SUCCESS, {}).items()}
        for key, name in HISTOGRAMS.items():
            if name in after.histograms:
                hists[key] = HistogramDelta.between(
                    before.histograms.get(name), after.histograms[name]
                )
    ts = [s.t for s in samples]
    end = after.t if after is not None else (ts[-1] if ts else 0.0)
    series = {key: [s.gauges.get(name, math.nan) for s in samples] for key, name in GAUGES.items()}
    gauges = {
        key: g
        for key, vals in series.items()
        if not any(map(math.isnan, vals)) and (g := gauge_stats(ts, vals, end)) is not None
    }
    start = before.t if before is not None else (ts[0] if ts else end)
    last = after if after is not None else before
    sat = (
        saturated_fraction(ts, series["running"], series["waiting"], end, max_num_seqs)
        if "running" in gauges and "waiting" in gauges
        else None
    )
    over_time: dict[str, Series] = {k: series[k] for k in gauges}
    pre = COUNTERS["preemptions"]
    if before is not None and all(pre in s.counters for s in samples):
        base = before.counters.get(pre, 0.0)
        over_time["preemptions"] = [_delta(base, s.counters[pre]) for s in samples]
    return LevelTelemetry(
        source=source,
        window_s=max(0.0, end - start),
        has_deltas=before is not None and after is not None,
        counters=counters,
        request_success=success,
        gauges=gauges,
        histograms=hists,
        saturated_fraction=sat,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        samples=len(samples),
        missed_scrapes=missed,
        cache_config=last.cache_config if last is not None else None,
        series=downsample(ts, over_time, start) if gauges else None,
    )


def from_scrape(
    level: LevelScrape,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> LevelTelemetry:
    """:func:`summarize` over what a :class:`~autotune.telemetry.scrape.Scraper` gathered."""
    return summarize(
        level.before,
        level.after,
        level.samples,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        missed=level.stats.missed,
    )


def _delta(before: float | None, after: float) -> float:
    """Counter increase; a counter that went down was reset (restart): count from zero."""
    return after if before is None or after < before else after - before
