"""Server-side telemetry per load level and the bottleneck it points at.

- :mod:`~autotune.telemetry.scrape`: parse vLLM's ``/metrics`` (current and older names),
  scrape it before, during and after a level, counting the scrapes a busy host misses.
- :mod:`~autotune.telemetry.summary`: :class:`LevelTelemetry` (counter and histogram deltas,
  gauge statistics) from scrapes (the simulated engine's timeline: :mod:`autotune.sim`).
- :mod:`~autotune.telemetry.prometheus`: the same summary from a user's Prometheus (PromQL
  over the level's window) and the file-based service-discovery targets file it watches.
- :mod:`~autotune.telemetry.diagnosis`: memory-bound, token-budget-bound, concurrency-capped,
  headroom or inconclusive, with evidence and the next move (the seed guide's step 2,
  docs/method.md#3-reading-the-bottleneck).
"""

from __future__ import annotations

from autotune.telemetry.diagnosis import KINDS, Diagnosis, Kind, diagnose
from autotune.telemetry.prometheus import PrometheusTelemetry, publish_sd_target, write_sd_targets
from autotune.telemetry.scrape import (
    HistogramData,
    LevelScrape,
    Scraper,
    ScrapeStats,
    Snapshot,
    parse_metrics,
    scrape,
)
from autotune.telemetry.summary import (
    BudgetUse,
    GaugeStats,
    HistogramDelta,
    LevelTelemetry,
    from_scrape,
    summarize,
)

__all__ = [
    "KINDS",
    "BudgetUse",
    "Diagnosis",
    "GaugeStats",
    "HistogramData",
    "HistogramDelta",
    "Kind",
    "LevelScrape",
    "LevelTelemetry",
    "PrometheusTelemetry",
    "ScrapeStats",
    "Scraper",
    "Snapshot",
    "diagnose",
    "from_scrape",
    "parse_metrics",
    "publish_sd_target",
    "scrape",
    "summarize",
    "write_sd_targets",
]
