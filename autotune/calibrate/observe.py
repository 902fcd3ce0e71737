"""What a probe measured, reduced to the few figures the fit compares (docs/calibrate.md#3-the-fit).

The same reduction reads a live server's client records and the simulated twin's request
timings, so measured and predicted figures are the same statistic of the same load: the
trimmed means of a probe's inter-token gaps and TTFTs, and the mean TTFT of a burst's slowest
quarter (the API server's queue), flushed requests left out
(:func:`flushed`); and, where the server's ``/metrics`` gave them, the engine core's own mean
inter-token gap and prefill time over the probe (:class:`EngineSums`), which no API-server
delay reaches. Why trimmed means and not medians: a request's TTFT jumps
by a whole step when its arrival crosses a step's start, and a median of a few requests
jumps with it, which leaves the fit's finite differences meaningless; a mean moves by a
fraction of that, and trimming keeps a real server's stray pause out. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.calibrate.probes import Probe
from autotune.loadgen import RequestRecord
from autotune.sim import RequestTiming

__all__ = [
    "ENGINE_METRICS",
    "FLUSH_GAP_S",
    "EngineSums",
    "Observation",
    "Timing",
    "engine_sums_of_sim",
    "flushed",
    "observe",
    "timings_of_records",
    "timings_of_sim",
    "trimmed_mean",
]

_TRIM = 0.1  # share cut from each end
# The figures of the engine core's own histograms (EngineSums), by metric name
ENGINE_METRICS = ("engine_itl", "engine_prefill")
# A gap this short is no engine step: the client read tokens that were written together.
FLUSH_GAP_S = 2e-4


@dataclass(frozen=True)
class Timing:
    """One request's client-side timing: TTFT and the gaps between its tokens (seconds)."""

    ttft: float
    itl: tuple[float, ...]


@dataclass(frozen=True)
class EngineSums:
    """The engine core's timing of a probe's requests, as vLLM's histograms add it up: the
    sum and count of ``vllm:inter_token_latency_seconds`` and of
    ``vllm:request_prefill_time_seconds`` over the probe. vLLM stamps both with the engine
    core's clock when a step's outputs are made (the first token's step end minus the
    request's scheduling; one step end minus the one before), so neither holds the API
    server's delay nor a starved stream's flush (docs/calibrate.md#2-the-probe-suite)."""

    itl_sum: float = 0.0
    itl_count: float = 0.0
    prefill_sum: float = 0.0
    prefill_count: float = 0.0

    def __add__(self, other: EngineSums) -> EngineSums:
        return EngineSums(
            self.itl_sum + other.itl_sum,
            self.itl_count + other.itl_count,
            self.prefill_sum + other.prefill_sum,
            self.prefill_count + other.prefill_count,
        )


@dataclass(frozen=True)
class Observation:
    """One figure of one probe: ``metric`` is ``itl`` (the gaps' trimmed mean), ``ttft``
    (trimmed mean), ``ttft_last`` (a burst's slowest quarter's mean), or the engine core's
    means ``engine_itl`` and ``engine_prefill`` (:class:`EngineSums`); seconds."""

    probe: str
    metric: str
    value: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.probe, self.metric)


def timings_of_records(records: Iterable[RequestRecord]) -> list[Timing]:
    """The successful requests of a live run (warm-up requests left out)."""
    return [
        Timing(r.ttft, tuple(r.itl))
        for r in records
        if r.success and not r.warmup and r.ttft is not None
    ]


def timings_of_sim(requests: Iterable[RequestTiming]) -> list[Timing]:
    """The simulated requests as their client saw them (delivered times)."""
    return [
        Timing(r.ttft, tuple(float(x) for x in np.diff(r.token_times)))
        for r in requests
        if not r.rejected and not r.warmup
    ]


def engine_sums_of_sim(requests: Iterable[RequestTiming]) -> EngineSums:
    """What a simulated server's histograms would add up for these requests: per request
    with a token, its prefill (the first token's step end minus its scheduling) and, from its
    second token on, one gap per token (its last token's step end minus its first's)."""
    out = EngineSums()
    for r in requests:
        tt = r.engine_token_times
        if r.rejected or r.warmup or len(tt) == 0:
            continue
        out += EngineSums(float(tt[-1] - tt[0]), len(tt) - 1, float(tt[0] - r.scheduled), 1)
    return out


def trimmed_mean(values: Sequence[float], cut: float = _TRIM) -> float:
    """The mean of ``values`` without the lowest and highest ``cut`` share of them."""
    v = np.sort(np.asarray(values, dtype=float))
    k = int(len(v) * cut)
    return float(v[k : len(v) - k].mean()) if len(v) > 2 * k else float(v.mean())


def flushed(t: Timing) -> bool:
    """Whether the request's tokens reached its client in a flush rather than a stream: most
    of its gaps shorter than any engine step (:data:`FLUSH_GAP_S`). A starved API server (a
    host whose cores the engine fills) writes a whole stream at once; its TTFT and gaps then
    time the starvation, not the engine (docs/calibrate.md#2-the-probe-suite)."""
    gaps = t.itl
    return len(gaps) >= 4 and sum(g < FLUSH_GAP_S for g in gaps) > len(gaps) / 2


def observe(
    probe: Probe, timings: Sequence[Timing], engine: EngineSums | None = None
) -> list[Observation]:
    """The figures ``probe`` is for (module docstring): the client's none when no request
    succeeded, or when every one was flushed (:func:`flushed`: they timed the starvation);
    the engine core's from ``engine`` wherever it counted something."""
    out: list[Observation] = []
    timings = [t for t in timings if not flushed(t)]
    if timings:
        ttfts = [t.ttft for t in timings]
        gaps = [g for t in timings for g in t.itl]
        out.append(Observation(probe.name, "ttft", trimmed_mean(ttfts)))
        if probe.kind in ("decode", "concurrency") and gaps:
            out.append(Observation(probe.name, "itl", trimmed_mean(gaps)))
        if probe.kind == "burst" and len(ttfts) >= 4:
            last = sorted(ttfts)[-(len(ttfts) // 4) :]
            out.append(Observation(probe.name, "ttft_last", float(np.mean(last))))
    if engine is not None:
        itl, prefill = ENGINE_METRICS
        if engine.itl_count > 0:
            out.append(Observation(probe.name, itl, engine.itl_sum / engine.itl_count))
        if engine.prefill_count > 0:
            out.append(Observation(probe.name, prefill, engine.prefill_sum / engine.prefill_count))
    return out
