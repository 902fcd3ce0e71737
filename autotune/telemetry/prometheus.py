"""Prometheus mode: a level's :class:`LevelTelemetry` from PromQL, and the targets file.

Workers get a fresh port per trial, so autotune writes a file-based service-discovery targets
file (:func:`write_sd_targets`) that the user's Prometheus watches, one target per running
worker with a ``trial`` label; every query below selects ``{trial="..."}``. A scrape config
(also in ``configs/prometheus.yml``)::

    scrape_configs:
      - job_name: autotune
        scrape_interval: 1s      # levels last tens of seconds: sample them densely
        scrape_timeout: 1s
        file_sd_configs:
          - files: ["/var/lib/autotune/prometheus/*.json"]
            refresh_interval: 30s  # inotify sees the rename at once; this is the fallback

and ``telemetry.prometheus_url`` pointing at that Prometheus.

Counters and histogram buckets use ``increase()`` over the level's window *snapped to the
scrapes that bracket it* (the last sample at or before each end, plus 1 ms): ``increase()``
extrapolates from its first and last samples to the range's edges, which on a 10 s level at
0.5 s scrapes inflates a delta by up to ~10 %; with the edges on samples it is the exact,
reset-aware difference. Gauges use ``max_over_time``/``avg_over_time`` over the exact window,
and a ``query_range`` at the scrape interval for the time-weighted mean and the share of time
running sat at ``max_num_seqs`` with requests waiting. A scrape must exist before the level
starts (:meth:`PrometheusTelemetry.wait_for_sample`), else there is no delta to take.

prometheus-api-client is synchronous (requests): call from async code via
``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from autotune.errors import ConfigError, ServiceError
from autotune.telemetry.scrape import ALIASES
from autotune.telemetry.stats import GaugeStats, HistogramDelta, saturated_fraction
from autotune.telemetry.summary import COUNTERS, GAUGES, HISTOGRAMS, SUCCESS, LevelTelemetry

__all__ = ["PrometheusTelemetry", "publish_sd_target", "write_sd_targets"]

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TARGET = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^\s/:\[\]]+):\d{1,5}")
_ANCHOR = GAUGES["running"]  # exposed by every vLLM version: its timestamps are the scrapes'
_OLD = {new: old for old, new in ALIASES.items()}


def write_sd_targets(path: Path | str, targets: Sequence[tuple[str, Mapping[str, str]]]) -> None:
    """Write Prometheus's file_sd JSON (``[{"targets": [...], "labels": {...}}]``) atomically.

    A temp file in the same folder, then ``os.replace``: Prometheus never reads half a file.
    The temp name starts with ``.`` and ends in ``.tmp`` so a ``*.json`` pattern skips it.
    """
    path = Path(path)
    groups = []
    for target, labels in targets:
        if not _TARGET.fullmatch(target):
            raise ConfigError(f"service-discovery target {target!r} is not host:port")
        bad = [k for k in labels if not _LABEL.fullmatch(k) or k.startswith("__")]
        if bad:
            raise ConfigError(f"invalid Prometheus label name(s) for {target}: {', '.join(bad)}")
        groups.append({"targets": [target], "labels": {k: str(v) for k, v in labels.items()}})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(groups, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write service-discovery file {path}: {exc}") from exc


_SD_LOCK = threading.Lock()
_SD_TARGETS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}


def publish_sd_target(
    path: Path | str, owner: str, target: str | None, labels: Mapping[str, str] | None = None
) -> None:
    """Set ``owner``'s target in the targets file at ``path`` (``target`` None: remove it),
    keeping every other owner's: the trial lanes of one controller run a worker each at once
    and share the file (docs/parallel.md#2-lanes)."""
    key = str(Path(path).resolve())
    with _SD_LOCK:
        owned = _SD_TARGETS.setdefault(key, {})
        if target is None:
            owned.pop(owner, None)
        else:
            owned[owner] = (target, dict(labels or {}))
        write_sd_targets(path, [owned[k] for k in sorted(owned)])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class PrometheusTelemetry:
    """Queries one Prometheus (``url``) for levels of trials selected by their ``trial`` label.

    ``scrape_interval_s`` is the job's interval (the ``query_range`` step). Any failure to talk
    to Prometheus, or an answer it should not give, raises :class:`ConfigError`.
    """

    def __init__(
        self, url: str, *, scrape_interval_s: float = 1.0, timeout_s: float = 10.0
    ) -> None:
        self.url = url.rstrip("/")
        self.scrape_interval_s = scrape_interval_s
        self.timeout_s = timeout_s
        # A short retry: an unreachable Prometheus should fail a check in seconds, not minutes.
        self._prom = PrometheusConnect(
            url=self.url,
            disable_ssl=True,
            timeout=max(1, math.ceil(timeout_s)),  # int per its API
            retry=Retry(total=2, backoff_factor=0.1, status_forcelist=[502, 503, 504]),
        )

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        try:
            result = fn(*args, **kwargs)
        except (
            requests.RequestException,
            PrometheusApiClientException,
            ValueError,
            KeyError,
        ) as exc:
            raise ServiceError(f"Prometheus at {self.url}: {_one_line(exc)}") from exc
        if not isinstance(result, list):
            raise ServiceError(f"Prometheus at {self.url}: unexpected answer {result!r:.100}")
        return result

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query evaluated at ``at`` (epoch seconds)."""
        return self._call(self._prom.custom_query, promql, params={"time": f"{at:.3f}"})

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        # The client rounds start/end to whole seconds; params are sent in their place.
        return self._call(
            self._prom.custom_query_range,
            promql,
            datetime.fromtimestamp(start, UTC),
            datetime.fromtimestamp(end, UTC),
            f"{step:g}",
            params={"start": f"{start:.3f}", "end": f"{end:.3f}"},
        )

    def check(self) -> None:
        """Raise :class:`ServiceError` unless Prometheus answers a query."""
        self.query("vector(1)", time.time())

    def _sel(self, trial: str) -> str:
        return "{trial=" + json.dumps(trial) + "}"

    def _value(self, promql: str, at: float) -> float | None:
        rows = self.query(promql, at)
        return float(rows[0]["value"][1]) if rows else None

    def last_sample(self, trial: str, at: float) -> float | None:
        """Timestamp of the trial's last scrape at or before ``at`` (None if none)."""
        return self._value(f"max(timestamp({_ANCHOR}{self._sel(trial)}))", at)

    def wait_for_sample(self, trial: str, after: float, timeout_s: float = 30.0) -> float:
        """Block until Prometheus holds a scrape of ``trial`` taken after ``after``."""
        deadline = time.monotonic() + timeout_s
        while True:
            ts = self.last_sample(trial, time.time())
            if ts is not None and ts > after:
                return ts
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"Prometheus at {self.url} has no scrape of trial {trial!r} after "
                    f"{after:.3f} within {timeout_s:g} s: does a file_sd_configs job watch "
                    "the targets file?"
                )
            time.sleep(min(0.2, self.scrape_interval_s / 2))

    def _increase(
        self, family: str, suffix: str, trial: str, window_ms: int, at: float, by: str = ""
    ) -> dict[str, float]:
        names = [family] + ([_OLD[family]] if family in _OLD else [])
        inner = " or ".join(
            f"increase({n}{suffix}{self._sel(trial)}[{window_ms}ms])" for n in names
        )
        rows = self.query(f"sum by ({by}) ({inner})" if by else f"sum({inner})", at)
        return {str(r["metric"].get(by, "")): float(r["value"][1]) for r in rows}

    def level(
        self,
        trial: str,
        start: float,
        end: float,
        *,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> LevelTelemetry:
        """The level ``[start, end]`` (epoch seconds) of ``trial``, as direct scraping gives."""
        t_start, t_end = self.last_sample(trial, start), self.last_sample(trial, end)
        counters: dict[str, float] = {}
        success: dict[str, float] = {}
        hists: dict[str, HistogramDelta] = {}
        # No scrape inside the level (t_end == t_start): Prometheus saw nothing of it.
        has_deltas = t_start is not None and t_end is not None and t_end > t_start
        if has_deltas and t_start is not None and t_end is not None:
            win = max(1, round((t_end - t_start) * 1000) + 1)
            for key, name in COUNTERS.items():
                got = self._increase(name, "_total", trial, win, t_end)
                if got:
                    counters[key] = sum(got.values())
            success = self._increase(SUCCESS, "_total", trial, win, t_end, "finished_reason")
            for key, name in HISTOGRAMS.items():
                buckets = self._increase(name, "_bucket", trial, win, t_end, "le")
                if not buckets:
                    continue
                cum = sorted((float(le), n) for le, n in buckets.items())
                total = sum(self._increase(name, "_count", trial, win, t_end).values())
                hists[key] = HistogramDelta(
                    tuple(cum), sum(self._increase(name, "_sum", trial, win, t_end).values()), total
                )
        gauges, sat, n = self._gauges(trial, start, end, max_num_seqs)
        info = self.query(f"vllm:cache_config_info{self._sel(trial)}", end)
        cache = (
            {
                k: v
                for k, v in info[0]["metric"].items()
                if k not in ("__name__", "trial", "job", "instance")
            }
            if info
            else None
        )
        return LevelTelemetry(
            source="prometheus",
            window_s=max(0.0, end - start),
            has_deltas=has_deltas,
            counters=counters,
            request_success=success,
            gauges=gauges,
            histograms=hists,
            saturated_fraction=sat,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            samples=n,
            cache_config=cache,
        )

    def _gauges(
        self, trial: str, start: float, end: float, max_num_seqs: int | None
    ) -> tuple[dict[str, GaugeStats], float | None, int]:
        win = f"{max(1, round((end - start) * 1000))}ms"
        series: dict[str, dict[float, float]] = {}
        gauges: dict[str, GaugeStats] = {}
        for key, family in GAUGES.items():
            # The worst engine's KV usage, the others summed (as scrape.py aggregates them).
            agg = "max" if family.endswith("_perc") else "sum"
            for name in [family] + ([_OLD[family]] if family in _OLD else []):
                sel = f"{name}{self._sel(trial)}"
                peak = self._value(f"{agg}(max_over_time({sel}[{win}]))", end)
                if peak is None:
                    continue  # not exposed under this name: try the older one
                mean = self._value(f"{agg}(avg_over_time({sel}[{win}]))", end)
                count = self._value(f"max(count_over_time({sel}[{win}]))", end)
                rows = self.query_range(f"{agg}({sel})", start, end, self.scrape_interval_s)
                points = {float(t): float(v) for t, v in rows[0]["values"]} if rows else {}
                series[key] = points
                # query_range points are evenly spaced: their mean is the time-weighted one.
                twm = sum(points.values()) / len(points) if points else peak
                gauges[key] = GaugeStats(
                    int(count or 0), peak, mean if mean is not None else peak, twm
                )
                break
        sat = None
        ts = sorted(set(series.get("running", {})) & set(series.get("waiting", {})))
        if ts:  # evenly spaced points: each holds one step, the last one too
            sat = saturated_fraction(
                ts,
                [series["running"][t] for t in ts],
                [series["waiting"][t] for t in ts],
                ts[-1] + self.scrape_interval_s,
                max_num_seqs,
            )
        samples = gauges["running"].samples if "running" in gauges else 0
        return gauges, sat, samples
