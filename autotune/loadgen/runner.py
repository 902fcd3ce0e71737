"""Send a workload to a server on schedule and collect one record per request:
:func:`run_load` checks its options, drives one :class:`~autotune.loadgen.sender.LoadRun`
(the sending side) and assembles the :class:`LoadResult` (the records, their summary and an
early stop's record).

Open loop: each request with an ``arrival`` is started by a scheduler loop that sleeps
until ``t0 + arrival / time_scale`` on the monotonic clock (``perf_counter``), so a slow
request never delays the next arrival; the gap between planned and actual send is
recorded as scheduling lag (it includes waiting for a ``max_concurrency`` slot, vLLM's
client queue time). Closed loop: requests without ``arrival`` start as soon as one of
``max_concurrency`` slots is free (all at once without a limit, vLLM's ``rate=inf``).

Times in records, ``duration`` and the summary are engine seconds: wall seconds times
``time_scale`` for a server that runs faster than wall time; timeouts stay wall seconds.
``duration`` bounds the measured phase from t0 (after warm-ups, just before the first
arrival, as vLLM starts its clock) to the last finish.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.loadgen.bench_stats import (
    ClientLoop,
    RequestRecord,
    length_warning,
    summarize,
    windowed,
)
from autotune.loadgen.client import make_session
from autotune.loadgen.client_limit import LOOP_LAG_KEY
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.loop_lag import LoopLagProbe
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.sender import EARLY_STOPPED, STOPPED, LoadRun, ProgressSnapshot
from autotune.loadgen.spec import RequestSpec
from autotune.loadgen.stop_rule import stopped_summary
from autotune.loadgen.stopped import StopInfo
from autotune.loadgen.verdict_point import VerdictAt

__all__ = ["LoadResult", "ServerInfo", "probe_server", "run_load"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadResult:
    """Every record (warm-ups first, marked), the measured duration and its summary."""

    records: list[RequestRecord]
    duration: float  # engine seconds, t0 to the last finish
    summary: dict[str, Any]
    time_scale: float = 1.0
    started_at: float = 0.0  # time.time() at t0, to line up with Prometheus samples
    warmup_records: int = 0
    # Engine seconds from t0 at which the caller's ``stop`` event was set (None: it never
    # was): nothing was sent after it, requests still in flight were cancelled.
    stopped_at: float | None = None
    origin: float = 0.0  # time.perf_counter() at t0: converts other clocks to record times
    # the early-stop rule ended the run (docs/tuning.md#10-early-stop-inside-a-level): its
    # reason and when (the summary holds only bench keys); the requests it cut have no record
    early_stop: StopInfo | None = None
    wall_s: float = 0.0  # wall seconds of the measured phase, t0 to its end
    # where ``options.observe`` found the run infeasible without ending it (None: it did not)
    observed: VerdictAt | None = None

    def windowed(self, window_s: float) -> list[dict[str, Any]]:
        return windowed(self.records, window_s)


async def run_load(
    base_url: str,
    requests: Sequence[RequestSpec],
    options: LoadOptions,
    *,
    progress: Callable[[ProgressSnapshot], None] | None = None,
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """Run ``requests`` against ``base_url`` as ``options`` say and return every record with
    a summary.

    Sending stops at ``options.duration``; ``options.drain_timeout`` (wall seconds) then
    bounds the wait for requests in flight; the rest are cancelled and recorded as failed
    (``"cancelled: at drain timeout"``). Cancelling the caller's task cancels every request
    and closes the session before CancelledError propagates. ``progress`` sees a snapshot
    every ``options.progress_interval`` wall seconds.

    ``stop`` (e.g. a worker's death event) ends the run early: once it is set nothing more is
    sent, requests in flight are cancelled and recorded as failed, and what completed is
    kept; :attr:`LoadResult.stopped_at` says when.

    ``options.early_stop`` ends the run the same way as soon as the level's verdict is
    certain (docs/tuning.md#10-early-stop-inside-a-level); the requests it cuts get no
    record, and :attr:`LoadResult.early_stop` says why and when.
    """
    options.validate()
    o = options
    async with make_session(o.max_concurrency) as session:
        run = LoadRun(
            session,
            base_url,
            o.request_options(),
            o.max_concurrency,
            o.time_scale,
            progress,
            o.progress_interval,
            planned=len(requests),
            stop=stop,
            early_stop=o.early_stop,
            observe=o.observe,
        )
        # A full collection walks every live object: with a large heap (the caller's workload,
        # earlier runs' records) that is a pause of tens of ms on the loop that sends on
        # schedule. Freezing moves what exists now out of the collector's reach for the run.
        gc.collect()
        gc.freeze()
        watcher: asyncio.Future[None] | None = None
        # was the client's own loop late? (docs/loadgen.md#5-client-limited-levels)
        probe = LoopLagProbe()
        probing: asyncio.Future[None] | None = None
        try:
            if o.warmup and requests:
                await run.warmup(requests, o.warmup, o.drain_timeout)
            run.start_clock()
            started_at = time.time()
            probing = asyncio.ensure_future(probe.run())
            watcher = asyncio.ensure_future(run.watch()) if run.rule is not None else None
            await run.schedule_until_stopped(requests, o.duration)
            drained = run.stopping() or await run.wait_all(o.drain_timeout, "drain")
            if run.halt.is_set():
                await run.cancel(EARLY_STOPPED)
            elif run.stopping():
                await run.cancel(STOPPED)
            elif not drained:
                await run.cancel("cancelled: at drain timeout")
        finally:
            # Only non-empty on an error or cancellation path: leave no request task behind.
            await run.cancel("cancelled: load run aborted")
            if watcher is not None:
                watcher.cancel()
            if probing is not None:
                probing.cancel()
            gc.unfreeze()
    wall = time.perf_counter() - run.t0
    kept = [a for a in run.attempts if id(a) not in run.cut]
    records = [a.record() for a in run.warm] + [a.record() for a in kept]
    measured = records[len(run.warm) :]
    elapsed = max((r.finished_at for r in measured), default=0.0)
    run.report("done", force=True)
    summary = summarize(
        records,
        elapsed,
        goodput_slos=o.goodput_slos,
        percentiles=o.percentiles,
        time_scale=o.time_scale,
        client_loop=_loop(requests, o.max_concurrency),
    )
    summary["p50_loop_lag_ms"] = probe.percentile_ms(50)
    summary[LOOP_LAG_KEY] = probe.percentile_ms(90)
    if (warning := length_warning(summary)) is not None:
        log.warning("%s", warning)
    ended: StopInfo | None = None
    if run.reason is not None and run.halted_at is not None:
        summary, ended = _stopped(run, summary, records, requests, wall)
    return LoadResult(
        records=records,
        duration=elapsed,
        summary=summary,
        time_scale=o.time_scale,
        started_at=started_at,
        warmup_records=len(run.warm),
        stopped_at=(None if run.stopped_at is None else (run.stopped_at - run.t0) * o.time_scale),
        origin=run.t0,
        early_stop=ended,
        wall_s=wall,
        observed=run.observed,
    )


def _loop(requests: Sequence[RequestSpec], max_concurrency: int | None) -> ClientLoop:
    """How the requests were sent: the send lag is the client's alone only in an open loop
    without a concurrency cap (docs/loadgen.md#5-client-limited-levels)."""
    arrivals = {q.arrival for q in requests if q.arrival is not None}
    if not arrivals:
        return "closed"
    if max_concurrency is not None:
        return "open-capped"
    # all due at once: the lag is how long sending them all took, not a missed schedule
    return "open" if len(arrivals) > 1 else "burst"


def _stopped(
    run: LoadRun,
    summary: dict[str, Any],
    records: Sequence[RequestRecord],
    requests: Sequence[RequestSpec],
    wall: float,
) -> tuple[dict[str, Any], StopInfo]:
    """The summary of a run the early-stop rule ended and its stop (wall seconds replayed)."""
    assert run.reason is not None and run.halted_at is not None
    known = [r.ttft for r in records if r.success and not r.warmup and r.ttft is not None]
    known += [b for b in run.cut.values() if b is not None]
    arrivals = [q.arrival for q in requests if q.arrival is not None]
    stop_s = (run.halted_at - run.t0) * run.scale
    return stopped_summary(
        summary,
        reason=run.reason,
        at_request=sum(1 for a in run.attempts if a.sent is not None),
        planned=run.planned,
        replay_s=wall,
        ttft_known_s=known,
        saved_s_at_least=(max(arrivals) - stop_s) / run.scale if arrivals else 0.0,
        failed=run.tally.failed,
    )
