"""Reading a vLLM server's ``/metrics`` page: parsing, one scrape, and a per-level scraper.

A page becomes a :class:`Snapshot` keyed by the *current* vLLM family names
(docs/vllm.md#6-prometheus-metrics): counters without ``_total``, older names mapped onto newer
ones (a v0.10 page shows both with the same values, so the newer one wins and nothing is
counted twice). Series of several engines (data parallel) are added up; ``_perc`` gauges take
the worst engine instead, since a full KV cache on one engine is what preempts there.

:class:`Scraper` takes a snapshot before a load level, one every ``interval_s`` during it and
one after it. On a saturated 2-core host a scrape can stall for seconds
(docs/vllm.md#62-families-on-a-032-page), so mid-level scrapes may fail or come late: they are
counted, never fatal, and the summaries rest on the before/after pair first.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ALIASES",
    "KNOWN_COUNTERS",
    "HistogramData",
    "LevelScrape",
    "ScrapeStats",
    "Scraper",
    "Snapshot",
    "build_snapshot",
    "parse_metrics",
    "scrape",
]

# Old name -> current name (docs/vllm.md#64-old-names). Counters are given without `_total`.
ALIASES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
}
# Counters that an untyped page (no `# TYPE` line) may expose without `_total`.
KNOWN_COUNTERS = frozenset(
    {
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
    }
)
# Labels every engine series carries; any other label splits a family (finished_reason, ...).
_ENGINE_LABELS = frozenset({"model_name", "engine", "le", "trial", "job", "instance"})
_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class HistogramData:
    """One histogram family: ``(le, cumulative count)`` ascending with ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True)
class Snapshot:
    """The ``vllm:`` families of one page at wall time ``t`` (``time.time()``).

    ``labeled`` splits a counter or gauge by its extra label (``finished_reason`` of
    ``vllm:request_success``, ...): key = that label's value, or ``k=v,...`` for several.
    """

    t: float
    counters: Mapping[str, float]
    gauges: Mapping[str, float]
    histograms: Mapping[str, HistogramData]
    labeled: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    cache_config: Mapping[str, str] | None = None
    elapsed_s: float = 0.0


def _label_key(labels: Mapping[str, str]) -> str | None:
    extra = sorted((k, v) for k, v in labels.items() if k not in _ENGINE_LABELS)
    if not extra:
        return None
    return extra[0][1] if len(extra) == 1 else ",".join(f"{k}={v}" for k, v in extra)


def _classify(
    name: str, labels: Mapping[str, str], bucketed: set[str], types: Mapping[str, str]
) -> tuple[str, str, str]:
    """``(kind, family, part)``: kind counter/gauge/histogram/info/skip, the family name as
    exposed (counters without ``_total``), and a histogram's part (bucket/sum/count)."""
    if not name.startswith("vllm:") or name.endswith("_created"):
        return "skip", name, ""
    base, _, suffix = name.rpartition("_")
    if base in bucketed and suffix in ("bucket", "sum", "count"):
        return "histogram", base, suffix
    if name == _INFO:
        return "info", name, ""
    family = name.removesuffix("_total")
    kind = (
        types.get(family)
        or types.get(name)
        or ("counter" if name.endswith("_total") or name in KNOWN_COUNTERS else "gauge")
    )
    return kind, family if kind == "counter" else name, ""


def build_snapshot(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    t: float,
    types: Mapping[str, str] | None = None,
) -> Snapshot:
    """A snapshot from raw ``(sample name, labels, value)`` triples.

    ``types`` maps family names to ``counter``/``gauge``/``histogram`` where the page declared
    them; for untyped samples the kind follows from the name:
    ``_bucket``/``_sum``/``_count`` of a family with buckets is a histogram, ``_total`` and the
    :data:`KNOWN_COUNTERS` are counters, the rest gauges. ``_created`` series are dropped.
    """
    rows = [(n, lb, float(v)) for n, lb, v in samples if not math.isnan(float(v))]
    bucketed = {
        n.removesuffix("_bucket") for n, lb, _ in rows if n.endswith("_bucket") and "le" in lb
    }
    classified = [(*_classify(n, lb, bucketed, types or {}), lb, v) for n, lb, v in rows]
    exposed = {family for kind, family, _, _, _ in classified if kind != "skip"}
    tables: dict[str, dict[str, float]] = {"counter": {}, "gauge": {}}
    labeled: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, dict[str, float]] = {}
    info: dict[str, str] | None = None
    for kind, family, part, labels, value in classified:
        key = ALIASES.get(family, family)
        if kind == "skip" or (key != family and key in exposed):
            continue  # an old name next to the current one (v0.10 shows both): keep the new
        if kind == "info":
            info = {k: v for k, v in labels.items() if k not in ("trial", "job", "instance")}
        elif kind == "histogram":
            if part == "bucket":
                le = float(labels["le"])
                b = buckets.setdefault(key, {})
                b[le] = b.get(le, 0.0) + value
            else:
                s = sums.setdefault(key, {"sum": 0.0, "count": 0.0})
                s[part] += value
        elif kind in tables:
            table = tables[kind]
            # One full KV cache preempts on its engine: the worst engine speaks for all.
            table[key] = (
                max(table.get(key, 0.0), value)
                if key.endswith("_perc")
                else (table.get(key, 0.0) + value)
            )
            sub = _label_key(labels)
            if sub is not None:
                split = labeled.setdefault(key, {})
                split[sub] = split.get(sub, 0.0) + value
    histograms = {
        key: HistogramData(
            tuple(sorted(b.items())),
            sums.get(key, {}).get("sum", 0.0),
            sums.get(key, {}).get("count", b.get(math.inf, 0.0)),
        )
        for key, b in buckets.items()
    }
    return Snapshot(
        t=t,
        counters=tables["counter"],
        gauges=tables["gauge"],
        histograms=histograms,
        labeled=labeled,
        cache_config=info,
    )


def parse_metrics(text: str, t: float | None = None) -> Snapshot:
    """Parse a Prometheus text page (vLLM's ``/metrics``). Raises ValueError if malformed."""
    types: dict[str, str] = {}
    samples: list[tuple[str, Mapping[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "gauge", "histogram"):
            types[family.name] = family.type
        samples.extend((s.name, s.labels, s.value) for s in family.samples)
    return build_snapshot(samples, time.time() if t is None else t, types)


@dataclass
class ScrapeStats:
    """What the mid-level scrapes cost: ``missed`` counts scheduled scrapes that gave no
    snapshot (failed, timed out, or skipped while an earlier one was still stalled)."""

    attempts: int = 0
    missed: int = 0
    timeouts: int = 0
    max_elapsed_s: float = 0.0


async def scrape(
    session: aiohttp.ClientSession, url: str, timeout: float, stats: ScrapeStats | None = None
) -> Snapshot | None:
    """One ``GET url``; None (counted in ``stats``) on any failure or after ``timeout`` s."""
    t0 = time.monotonic()
    if stats is not None:
        stats.attempts += 1
    snap: Snapshot | None = None
    try:
        async with asyncio.timeout(timeout), session.get(url) as resp:
            if resp.status == 200:
                snap = parse_metrics(await resp.text())
    except TimeoutError:
        if stats is not None:
            stats.timeouts += 1
    except (aiohttp.ClientError, OSError, ValueError, UnicodeDecodeError):
        pass
    elapsed = time.monotonic() - t0
    if stats is not None:
        stats.max_elapsed_s = max(stats.max_elapsed_s, elapsed)
        if snap is None:
            stats.missed += 1
    return None if snap is None else replace(snap, elapsed_s=elapsed)


@dataclass(frozen=True)
class LevelScrape:
    """Everything scraped for one load level."""

    before: Snapshot | None
    after: Snapshot | None
    samples: tuple[Snapshot, ...]
    stats: ScrapeStats


class Scraper:
    """Scrapes ``url`` before a level (:meth:`start`), every ``interval_s`` during it and after
    it (:meth:`stop`); also an async context manager (``result`` holds the level afterwards).

    Before/after scrapes get ``boundary_timeout_s`` and ``boundary_attempts`` because every
    delta needs them; a mid-level scrape gets ``timeout_s`` once, so one stall costs at most
    that long and the next tick proceeds.
    """

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 5.0,
        boundary_timeout_s: float = 10.0,
        boundary_attempts: int = 3,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0 or boundary_timeout_s <= 0 or boundary_attempts < 1:
            raise ValueError("intervals and timeouts must be positive, attempts at least 1")
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.boundary_timeout_s = boundary_timeout_s
        self.boundary_attempts = boundary_attempts
        self.stats = ScrapeStats()
        self.result: LevelScrape | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._before: Snapshot | None = None
        self._samples: list[Snapshot] = []

    async def _boundary(self) -> Snapshot | None:
        assert self._session is not None
        for _ in range(self.boundary_attempts):
            snap = await scrape(self._session, self.url, self.boundary_timeout_s)
            if snap is not None:
                return snap
        return None

    async def start(self) -> Snapshot | None:
        """Take the before snapshot and start the periodic scrapes."""
        if self._session is not None:
            raise RuntimeError("Scraper already started")
        # Its own session: the load generator's connection pool must not delay a scrape.
        self._session = aiohttp.ClientSession(trust_env=False)
        self._before = await self._boundary()
        self._task = asyncio.create_task(self._periodic(), name="telemetry-scraper")
        return self._before

    async def _periodic(self) -> None:
        assert self._session is not None
        t0 = time.monotonic()
        tick = 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, t0 + tick * self.interval_s - time.monotonic()))
            snap = await scrape(self._session, self.url, self.timeout_s, self.stats)
            if snap is not None:
                self._samples.append(snap)
            # Ticks that passed while this scrape stalled were never tried: missed too.
            due = math.floor((time.monotonic() - t0) / self.interval_s)
            if due > tick:
                self.stats.missed += due - tick
                tick = due

    async def stop(self) -> LevelScrape:
        """Stop the periodic scrapes, take the after snapshot, return the level."""
        if self._session is None:
            raise RuntimeError("Scraper not started")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            after = await self._boundary()
        finally:
            await self._session.close()
        self.result = LevelScrape(self._before, after, tuple(self._samples), replace(self.stats))
        return self.result

    async def abandon(self) -> None:
        """Stop without the after snapshot (:attr:`result` stays None): the server died or
        hung, and scraping it would only wait out the boundary timeouts (3 x 10 s on a
        stopped server, docs/vllm.md#10-whose-death-is-it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Scraper:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.result is not None or self._session is None:
            return
        if exc is None:
            await self.stop()
            return
        if self._task is not None:  # the level failed: no after scrape, just clean up
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._session.close()
