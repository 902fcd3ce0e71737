"""Adapters between the simulator and the layers below it (docs/architecture.md): a
workload's requests as the engine takes them, and the engine's own record as the telemetry
summary the HTTP server's ``/metrics`` would have given. They live on the simulator's side
so that the workload and telemetry packages never import it.
"""

from __future__ import annotations

import numpy as np

from autotune.sim.request import SimRequest
from autotune.sim.result import SimResult
from autotune.sim.vllm_page import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
)
from autotune.telemetry.stats import (
    Series,
    downsample,
    gauge_stats,
    histogram_of,
    saturated_fraction,
)
from autotune.telemetry.summary import LevelTelemetry
from autotune.workload.core import Workload, WorkloadRequest

__all__ = ["from_sim_timeline", "sim_request", "sim_requests"]


def sim_request(r: WorkloadRequest) -> SimRequest:
    """The same request for the in-process simulator (closed loop: arrival 0)."""
    return SimRequest(
        r.prompt_len,
        r.output_len,
        0.0 if r.arrival is None else r.arrival,
        prompt_token_ids=r.prompt_token_ids,
        request_id=r.request_id,
    )


def sim_requests(wl: Workload) -> list[SimRequest]:
    """Every request of ``wl``, in send order, for the in-process simulator."""
    return [sim_request(r) for r in wl.requests]


def from_sim_timeline(
    result: SimResult, start: float, end: float, max_num_batched_tokens: int, max_num_seqs: int
) -> LevelTelemetry:
    """The same summary from the simulated engine's own record over ``(start, end]`` (engine s).

    What the simulated server's ``/metrics`` would have shown: steps ending in the window are
    the gauge samples and iteration-token observations; requests finishing in it are observed
    in TTFT/e2e/queue histograms and ``request_success{finished_reason="length"}``; ITL gaps
    end in it. Prefix-cache counters exist only as run totals, so they appear only when the
    window holds every step.
    """
    tl = result.timeline
    in_win = (tl.t > start) & (tl.t <= end)

    def at(t: float) -> float:  # cumulative preemptions after the last step ending by t
        i = int(np.searchsorted(tl.t, t, side="right"))
        return float(tl.preemptions[i - 1]) if i > 0 else 0.0

    done = [r for r in result.requests if not r.rejected and start < r.finish <= end]
    gaps: list[np.ndarray] = []
    emitted = 0
    for r in result.requests:
        # the engine core's step ends, as vLLM's counters and ITL histogram stamp them
        # (docs/simulator.md#5-metrics-and-logs); TTFT and e2e below are as delivered
        tt = r.engine_token_times
        if r.rejected or len(tt) == 0 or tt[-1] <= start or tt[0] > end:
            continue
        emitted += int(((tt > start) & (tt <= end)).sum())
        later = tt[1:]
        gaps.append((later - tt[:-1])[(later > start) & (later <= end)])
    counters = {
        "preemptions": at(end) - at(start),
        "prompt_tokens": float(tl.prefill_tokens[in_win].sum()),
        "generation_tokens": float(emitted),
    }
    if len(tl.t) and start < tl.t[0] and end >= tl.t[-1]:
        counters["prefix_cache_queries"] = float(result.prefix_cache_queries)
        counters["prefix_cache_hits"] = float(result.prefix_cache_hits)
    hists = {
        "ttft": histogram_of([r.first_token - r.arrival for r in done], TTFT_BUCKETS),
        "itl": histogram_of(np.concatenate(gaps) if gaps else [], ITL_BUCKETS),
        "e2e": histogram_of([r.finish - r.arrival for r in done], REQUEST_LATENCY_BUCKETS),
        "queue_time": histogram_of(
            [r.scheduled - r.arrival for r in done], REQUEST_LATENCY_BUCKETS
        ),
        "iteration_tokens": histogram_of(tl.tokens[in_win], ITERATION_TOKENS_BUCKETS),
    }
    ts = tl.t[in_win]
    raw = {
        "running": tl.running[in_win],
        "waiting": tl.waiting[in_win],
        "kv_usage": tl.kv_usage[in_win],
    }
    gauges = {k: g for k, v in raw.items() if (g := gauge_stats(ts, v, end)) is not None}
    over_time: dict[str, Series] = {**raw, "preemptions": tl.preemptions[in_win] - at(start)}
    return LevelTelemetry(
        source="sim-timeline",
        window_s=end - start,
        has_deltas=True,
        counters=counters,
        request_success={"length": float(len(done))},
        gauges=gauges,
        histograms=hists,
        saturated_fraction=saturated_fraction(
            ts, raw["running"], raw["waiting"], end, max_num_seqs
        ),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        samples=int(in_win.sum()),
        series=downsample(ts, over_time, max(start, 0.0)),  # engine time starts at 0
    )
