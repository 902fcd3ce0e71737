"""Per-request records and the statistics ``vllm bench serve`` reports over them.

Pure functions, no I/O. Definitions follow ``vllm/benchmarks/serve.py`` so a trial scored
here is comparable with a ``vllm bench serve`` run: TTFT at the first chunk with choices,
ITL = gaps between token chunks pooled over requests, TPOT = (E2EL - TTFT) / (n - 1) per
request with n > 1 output tokens, statistics with numpy (percentiles: linear interpolation),
reported in milliseconds; failed requests count in ``failed`` but in no latency statistic.

All times in a record are engine seconds: the client multiplies wall-clock measurements by
the server's time scale when it builds the record, so nothing here needs to rescale.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from autotune.errors import ConfigError
from autotune.loadgen.level import error_rate, overlength_rate

__all__ = [
    "DEFAULT_PERCENTILES",
    "GOODPUT_METRICS",
    "ClientLoop",
    "RequestRecord",
    "error_kind",
    "length_warning",
    "peak_concurrency",
    "percentile_key",
    "summarize",
    "windowed",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
# Prompts the server counted differently from the requested lengths by more than this, on
# average (token-weighted), earn a warning: the run does not measure the intended workload.
LENGTH_TOLERANCE = 0.02
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # what vLLM's --goodput accepts, values in ms
# How a client sent a run: on arrival times with no concurrency cap ("open"), on arrival
# times within a ``max_concurrency`` cap ("open-capped"), all at once with no cap ("burst",
# vLLM's rate=inf), or on free slots ("closed").
ClientLoop = Literal["open", "open-capped", "burst", "closed"]


@dataclass(slots=True)
class RequestRecord:
    """What one request did. Times are engine seconds from the run's start (t = 0)."""

    request_id: str
    success: bool = False
    error: str = ""  # "<kind>: <detail>", empty on success (see error_kind)
    http_status: int | None = None
    prompt_len: int = 0  # planned / sent by the client
    prompt_tokens: int | None = None  # the server's count (usage), when it sent one
    output_tokens: int = 0  # usage.completion_tokens, else the number of token chunks
    scheduled_at: float = 0.0  # planned send time
    sent_at: float | None = None  # None: never sent (e.g. cancelled while queued)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between token chunks
    ttft: float | None = None
    e2el: float | None = None
    over_length: bool = False  # 400 because the prompt reaches max_model_len
    # Served, but fewer tokens than asked for: vLLM cuts max_tokens to max_model_len - prompt
    # (with ignore_eos nothing else stops a request early). Counted with the over-length ones.
    truncated: bool = False
    warmup: bool = False

    @property
    def input_tokens(self) -> int:
        """The server's prompt count when known: newest vLLM reports that one too."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_len

    @property
    def tpot(self) -> float:
        """(E2EL - TTFT) / (n - 1); 0 for n <= 1, which vLLM's goodput treats as passing."""
        if self.output_tokens <= 1 or self.ttft is None or self.e2el is None:
            return 0.0
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def error_kind(error: str) -> str:
    """The class of an error string: the text before its first colon ("http_500", "stall")."""
    kind, sep, _ = error.partition(":")
    kind = kind.strip()
    return kind if sep and kind and " " not in kind else "other"


def percentile_key(p: float) -> str:
    """vLLM's spelling: ``p99``, ``p99.9``, ``p50`` (integral values without a decimal)."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def _stats(name: str, seconds: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    # vLLM feeds ``values or 0`` to numpy, so an empty list reports zeros rather than NaN.
    arr = np.asarray(seconds if seconds else [0.0], dtype=float) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
    }
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def _check_slos(goodput_slos: dict[str, float]) -> None:
    for key, value in goodput_slos.items():
        if key not in GOODPUT_METRICS:
            raise ConfigError(
                f"unknown goodput SLO {key!r}: expected one of {', '.join(GOODPUT_METRICS)}"
            )
        if not value >= 0:  # also rejects NaN
            raise ConfigError(f"goodput SLO {key} must be a non-negative number of ms: {value}")


def _is_good(rec: RequestRecord, slos_s: dict[str, float]) -> bool:
    # vLLM compares in seconds, ``slo >= value`` (inclusive), with TPOT 0 for n <= 1.
    values = {"ttft": rec.ttft or 0.0, "tpot": rec.tpot, "e2el": rec.e2el or 0.0}
    return all(values[k] <= slo for k, slo in slos_s.items())


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Exact peak overlap of half-open [start, end) intervals (sweep line)."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((max(end, start), -1))
    # At equal times -1 sorts first: a request ending as another starts does not overlap it.
    events.sort()
    peak = level = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def _max_output_tokens_per_s(
    ok: Sequence[RequestRecord], measured: Sequence[RequestRecord]
) -> float:
    """vLLM's peak: token-chunk times bucketed into 1 s bins from the earliest send."""
    starts = [r.sent_at for r in measured if r.sent_at is not None]
    if not ok or not starts:
        return 0.0
    t_min = min(starts)
    times: list[float] = []
    for r in ok:
        if r.first_token_at is None:
            continue
        times.append(r.first_token_at)
        times.extend((r.first_token_at + np.cumsum(r.itl)).tolist())
    if not times:
        return 0.0
    buckets = np.floor(np.asarray(times) - t_min).astype(int)
    return float(np.bincount(buckets[buckets >= 0]).max(initial=0))


def summarize(
    records: Sequence[RequestRecord],
    duration: float,
    *,
    goodput_slos: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    time_scale: float = 1.0,
    client_loop: ClientLoop | None = None,
) -> dict[str, Any]:
    """``vllm bench serve``'s result keys (same names and units) plus autotune's extras.

    ``duration`` is engine seconds of the measured phase; ``goodput_slos`` maps ``ttft``,
    ``tpot``, ``e2el`` to limits in ms (``request_goodput`` is None without it, as in
    vLLM). ``time_scale`` is only reported: records are already in engine seconds.
    ``client_loop``: how a client sent the records (None: no client, the in-process
    simulator); with it the summary holds what :func:`autotune.loadgen.client_limit.check`
    reads. Warm-up records are ignored entirely.
    """
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ConfigError(f"percentile must be within [0, 100]: {p}")
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.success]
    failed = [r for r in measured if not r.success]
    per_s = 1.0 / duration if duration > 0 else 0.0
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)

    goodput: float | None = None
    if goodput_slos is not None:
        _check_slos(goodput_slos)
        slos_s = {k: v / 1000.0 for k, v in goodput_slos.items()}
        goodput = sum(1 for r in ok if _is_good(r, slos_s)) * per_s

    sent = [r for r in measured if r.sent_at is not None]
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) * per_s,
        "request_goodput": goodput,
        "output_throughput": total_out * per_s,
        "total_token_throughput": (total_in + total_out) * per_s,
        "max_output_tokens_per_s": _max_output_tokens_per_s(ok, measured),
        "max_concurrent_requests": peak_concurrency(
            (r.sent_at, r.finished_at) for r in sent if r.sent_at is not None
        ),
    }
    series: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.output_tokens > 1],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.e2el for r in ok if r.e2el is not None],
    }
    for name, values in series.items():
        out.update(_stats(name, values, percentiles))

    # The server's prompt counts against the requested lengths (successes with a usage
    # chunk): sum(measured) / sum(requested) - 1, None when the server reported none.
    counted = [r for r in ok if r.prompt_tokens is not None]
    requested = sum(r.prompt_len for r in counted)
    out["requested_input_tokens"] = requested
    out["prompt_len_deviation"] = (
        sum(r.input_tokens for r in counted) / requested - 1.0 if requested > 0 else None
    )
    # requests the server counted more than max(1 %, 2 tokens) away from the requested length
    out["prompts_off_length"] = sum(
        1
        for r in counted
        if abs(r.input_tokens - r.prompt_len) > max(2, math.floor(0.01 * r.prompt_len))
    )

    # Extras: why requests failed, and whether the client kept its schedule.
    lags = [r.sent_at - r.scheduled_at for r in sent if r.sent_at is not None]
    n_over = sum(1 for r in measured if r.over_length)
    n_trunc = sum(1 for r in ok if r.truncated)
    lag_ms = np.asarray(lags if lags else [0.0], dtype=float) * 1000.0
    out.update(
        {
            "over_length_rejections": n_over,
            "truncated_requests": n_trunc,
            # one definition of both rates (docs/tuning.md#3-the-per-level-record)
            "error_rate": error_rate(len(failed), n_over, len(measured)),
            "overlength_rate": overlength_rate(n_over, n_trunc, len(measured)),
            "errors_by_kind": dict(sorted(Counter(error_kind(r.error) for r in failed).items())),
            "mean_schedule_lag_ms": float(np.mean(lag_ms)),
            "p50_schedule_lag_ms": float(np.percentile(lag_ms, 50)),
            "p99_schedule_lag_ms": float(np.percentile(lag_ms, 99)),
            "max_schedule_lag_ms": float(np.max(lag_ms)),
            "warmup_requests": len(records) - len(measured),
            "time_scale": time_scale,
        }
    )
    if client_loop is not None:
        # what the client-limit check reads (docs/loadgen.md#5-client-limited-levels)
        planned = sorted(r.scheduled_at for r in sent)
        out["client_loop"] = client_loop
        out["mean_arrival_gap_ms"] = (
            (planned[-1] - planned[0]) / (len(planned) - 1) * 1000.0 if len(planned) > 1 else None
        )
        out["itl_gaps"] = len(series["itl"])
    return out


def length_warning(summary: dict[str, Any], tolerance: float = LENGTH_TOLERANCE) -> str | None:
    """One line when the server counted the prompts more than ``tolerance`` away from the
    requested lengths on average (``summary`` from :func:`summarize`), else None."""
    dev = summary.get("prompt_len_deviation")
    requested = summary.get("requested_input_tokens") or 0
    if dev is None or abs(dev) <= tolerance or not requested:
        return None
    measured = round(requested * (1.0 + dev))
    return (
        f"prompts measured {abs(dev):.1%} {'longer' if dev > 0 else 'shorter'} than requested "
        f"on average ({measured:,} prompt tokens counted by the server for {requested:,} "
        "requested): this run does not send the lengths its workload asks for"
    )


def windowed(records: Sequence[RequestRecord], window_s: float) -> list[dict[str, Any]]:
    """Statistics per consecutive window of ``window_s`` engine seconds, from t = 0.

    A request belongs to the window in which it finished, so a window's numbers are known
    as soon as it closes (what an early-stopping rule watching a live run can use).
    ``p99_ttft_ms`` is None for a window without completions.
    """
    if not window_s > 0:
        raise ConfigError(f"window length must be positive: {window_s}")
    measured = [r for r in records if not r.warmup and r.finished_at >= 0]
    if not measured:
        return []
    n_windows = max(1, math.ceil(max(r.finished_at for r in measured) / window_s))
    # A request finishing exactly on the last boundary belongs to the last window.
    bins: list[list[RequestRecord]] = [[] for _ in range(n_windows)]
    for r in measured:
        bins[min(int(r.finished_at // window_s), n_windows - 1)].append(r)
    out: list[dict[str, Any]] = []
    for i, members in enumerate(bins):
        ok = [r for r in members if r.success]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        out.append(
            {
                "start": i * window_s,
                "end": (i + 1) * window_s,
                "completed": len(ok),
                "failed": len(members) - len(ok),
                "p99_ttft_ms": float(np.percentile(ttfts, 99)) * 1000.0 if ttfts else None,
                "request_throughput": len(ok) / window_s,
                "output_throughput": sum(r.output_tokens for r in ok) / window_s,
            }
        )
    return out
