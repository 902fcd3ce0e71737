"""The simulator's half of the in-process (``sim-virtual``) runner: one load level replayed
on the virtual clock, its per-request timings turned into the records the HTTP client
produces (so one metric implementation scores both), its early stop and its telemetry.
The runner in :mod:`autotune.tuning.measure.virtual_runner` wraps the result into a level
outcome; this side knows the engine and nothing of tuning (docs/architecture.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.stop_rule import StopRule, stopped_summary
from autotune.loadgen.stopped import StopInfo
from autotune.loadgen.verdict_point import VerdictAt
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.adapters import from_sim_timeline, sim_requests
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.request import RequestTiming, SimRequest
from autotune.sim.result import SimResult
from autotune.sim.stop_watch import SimWatch
from autotune.sim.virtual_loop import simulate
from autotune.telemetry.summary import LevelTelemetry
from autotune.workload.core import Workload

__all__ = [
    "WARMUP_PREFIX",
    "SimLevel",
    "jitter_seed",
    "records_from_sim",
    "replay_level",
    "sim_engine_args",
]

# warm-up requests' ids, for reading only: they are told apart by SimRequest.warmup
WARMUP_PREFIX = "warmup-"

_SIM_ARG_FIELDS = {
    "max_model_len",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "tensor_parallel_size",
    "block_size",
    "kv_cache_memory_bytes",
    "long_prefill_token_threshold",
    "enforce_eager",
}


def sim_engine_args(engine_args: Mapping[str, Any], static: Mapping[str, Any]) -> EngineArgs:
    """The simulator's EngineArgs from vLLM-named engine and static args (others ignored,
    as ``autotune sim serve`` ignores flags that do not change the simulation)."""
    merged = {**static, **engine_args}
    return EngineArgs(**{k: v for k, v in merged.items() if k in _SIM_ARG_FIELDS})


def jitter_seed(seed: int, scale: float) -> int:
    """The in-process engine's jitter seed for one level: a function of the study's seed
    and the load scale only, so a level's result never depends on which levels ran before
    it (common random numbers, docs/tuning.md#2-common-random-numbers)."""
    ss = np.random.SeedSequence([seed & 0xFFFFFFFF, round(scale * 1_000_000)])
    return int(ss.generate_state(1, np.uint64)[0])


def records_from_sim(res: SimResult) -> tuple[list[RequestRecord], float]:
    """One record per simulated request (warm-ups marked; requests an early stop left
    unfinished have none) and the last measured finish."""
    recs: list[RequestRecord] = []
    end = 0.0
    for r in res.requests:
        if r.warmup:
            recs.append(RequestRecord(request_id=r.request_id, success=True, warmup=True))
            continue
        if r.rejected:
            recs.append(
                RequestRecord(
                    request_id=r.request_id,
                    success=False,
                    error=f"over_length: {r.reject_reason}",
                    http_status=400,
                    prompt_len=r.prompt_len,
                    scheduled_at=r.arrival,
                    sent_at=r.arrival,
                    finished_at=r.arrival,
                    over_length=True,
                )
            )
            continue
        if math.isnan(r.finish):
            continue  # unfinished when the replay stopped
        tt = r.token_times
        end = max(end, r.finish)
        recs.append(
            RequestRecord(
                request_id=r.request_id,
                success=True,
                prompt_len=r.prompt_len,
                prompt_tokens=r.prompt_len,
                output_tokens=len(tt),
                scheduled_at=r.arrival,
                sent_at=r.arrival,
                first_token_at=r.first_token,
                last_token_at=r.finish,
                finished_at=r.finish,
                itl=np.diff(tt).tolist(),
                ttft=r.ttft,
                e2el=r.e2e,
                truncated=r.truncated,
            )
        )
    return recs, end


@dataclass(frozen=True)
class SimLevel:
    """One replayed level: the bench summary its records give (a stopped level's as
    :func:`~autotune.loadgen.stop_rule.stopped_summary` restates it), the engine's telemetry
    over the measured replay, the engine args it ran with, resolved, the engine seconds
    replayed (warm-ups excluded), the early stop that ended it (None: none did) and the
    measured requests' records (docs/loadgen.md#6-per-request-records). ``peak_running`` and
    ``peak_kv_usage`` are the most requests the engine ran at once and its highest KV cache
    usage (0..1) at any step, and ``preemptions`` every preemption, warm-ups included: the
    simulator sees every step, where scraped gauges only sample them
    (docs/tuning.md#14-settling-losing-trials)."""

    summary: dict[str, Any]
    telemetry: LevelTelemetry
    args: ResolvedArgs
    replay_s: float = 0.0
    stop: StopInfo | None = None
    records: tuple[RequestRecord, ...] = ()
    # where the observing rule found a level it did not stop infeasible (None: it did not)
    observed: VerdictAt | None = None
    peak_running: int = 0
    peak_kv_usage: float = 0.0
    preemptions: int = 0


def replay_level(
    model: ModelProfile,
    hardware: HardwareProfile,
    args: EngineArgs,
    wl: Workload,
    *,
    seed: int,
    jitter_cv: float,
    warmup: int = 0,
    early_stop: StopRule | None = None,
    observe: StopRule | None = None,
) -> SimLevel:
    """Replay ``wl`` (already scaled) once: ``warmup`` copies of its first requests
    (cycled) sent at once before the measured replay, as the HTTP load generator's warm-up
    does, and ``early_stop`` applied between steps (None: to the end). Without
    ``early_stop``, ``observe`` watches the replay and notes where it would have stopped
    (:attr:`SimLevel.observed`)."""
    reqs = sim_requests(wl)
    warm = [
        SimRequest(
            q.prompt_len,
            q.output_len,
            0.0,
            q.prompt_token_ids,
            f"{WARMUP_PREFIX}{i}-{q.request_id or i}",
            warmup=True,
        )
        for i, q in ((i, reqs[i % len(reqs)]) for i in range(warmup if reqs else 0))
    ]
    rule = early_stop or observe
    watch = SimWatch(rule, len(reqs), len(warm), observe=early_stop is None) if rule else None
    res = simulate(
        model,
        hardware,
        args,
        reqs,
        seed=seed,
        jitter_cv=jitter_cv,
        concurrency=wl.closed_loop_concurrency,
        warmup=warm,
        stop=watch,
    )
    recs, end = records_from_sim(res)
    measured = [r for r in res.requests if not r.warmup]
    start = min((r.arrival for r in measured), default=0.0)
    if res.stopped_at is not None:
        end = res.stopped_at
    summary = summarize(recs, max(end - start, 1e-9))
    stop, observed = None, None
    if watch is not None and watch.reason is not None and res.stopped_at is not None:
        summary, stop = _sim_stopped(summary, watch, res, measured, start, reqs, recs)
    elif watch is not None and watch.reason is not None:
        observed = VerdictAt(watch.reason, watch.arrived, len(reqs))
    r = res.args
    t0 = start if warm else -1.0  # the measured replay only
    tel = from_sim_timeline(res, t0, float("inf"), r.max_num_batched_tokens, r.max_num_seqs)
    measured_recs = tuple(q for q in recs if not q.warmup)
    tl = res.timeline
    return SimLevel(
        summary,
        tel,
        r,
        res.end - start,
        stop,
        measured_recs,
        peak_running=int(tl.running.max()) if len(tl.running) else 0,
        peak_kv_usage=float(tl.kv_usage.max()) if len(tl.kv_usage) else 0.0,
        preemptions=res.num_preemptions,
        observed=observed,
    )


def _sim_stopped(
    summary: dict[str, Any],
    watch: SimWatch,
    res: SimResult,
    measured: list[RequestTiming],
    start: float,
    reqs: list[SimRequest],
    recs: list[RequestRecord],
) -> tuple[dict[str, Any], StopInfo]:
    """The summary and the stop of a level the watch stopped: every TTFT known or bounded at
    the stop (docs/tuning.md#10-early-stop-inside-a-level) and what the stop saved at least
    (the arrivals still to come)."""
    assert watch.reason is not None and res.stopped_at is not None
    stop = res.stopped_at
    known = [
        r.ttft if not math.isnan(r.first_token) else stop - r.arrival
        for r in measured
        if not r.rejected
    ]
    span = max(q.arrival for q in reqs) - min(q.arrival for q in reqs) if reqs else 0.0
    return stopped_summary(
        summary,
        reason=watch.reason,
        at_request=watch.arrived,
        planned=len(reqs),
        replay_s=res.end - start,
        ttft_known_s=known,
        saved_s_at_least=start + span - stop,
        tpot_known_s=[r.tpot for r in recs if r.success and r.output_tokens > 1]
        + watch.tpot_bounds,
        failed=watch.tally.failed,
    )
