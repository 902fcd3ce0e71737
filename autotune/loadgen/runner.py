"""Send a workload to a server on schedule and collect one record per request.

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
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np

from autotune.errors import ConfigError
from autotune.loadgen.client import (
    DEFAULT_STALL_TIMEOUT,
    Attempt,
    Endpoint,
    RequestOptions,
    make_session,
    run_attempt,
)
from autotune.loadgen.early_stop import StopRule, Tally, stopped_summary
from autotune.loadgen.metrics import (
    DEFAULT_PERCENTILES,
    RequestRecord,
    length_warning,
    summarize,
    windowed,
)
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.spec import RequestSpec
from autotune.loadgen.stopped import StopInfo
from autotune.timing import sleep_until

__all__ = ["LoadResult", "ProgressSnapshot", "ServerInfo", "probe_server", "run_load"]

log = logging.getLogger(__name__)

_STOPPED = "cancelled: the run was stopped (stop event set)"
_EARLY = "cancelled: early stop, the level's verdict is certain"
_WATCH_S = 0.05  # wall seconds between early-stop checks of the requests in flight

Phase = Literal["warmup", "run", "drain", "done"]


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """Counts at one moment of a run (measured requests only; warm-ups have their phase)."""

    phase: Phase
    elapsed: float  # engine seconds since t0 (0 during warm-up)
    planned: int
    sent: int
    completed: int
    failed: int
    in_flight: int
    p99_ttft_ms: float | None = None  # over requests completed so far (for live displays)


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

    def windowed(self, window_s: float) -> list[dict[str, Any]]:
        return windowed(self.records, window_s)


class _Run:
    """State of one run; all counting happens on the event loop, so no locks."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        options: RequestOptions,
        max_concurrency: int | None,
        time_scale: float,
        progress: Callable[[ProgressSnapshot], None] | None,
        progress_interval: float,
        planned: int,
        stop: asyncio.Event | None = None,
        early_stop: StopRule | None = None,
    ) -> None:
        self.stop = stop
        self.stopped_at: float | None = None  # perf_counter() when the stop was seen
        self.rule = early_stop
        self.tally = Tally(planned)
        self.halt = asyncio.Event()  # set when the rule stops the run
        self.cut: dict[int, float | None] = {}  # id(attempt) -> TTFT known or bounded (s)
        self.halted_at: float | None = None  # perf_counter()
        self.reason: str | None = None
        self.session = session
        self.base_url = base_url
        self.options = options
        self.sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.scale = time_scale
        self.progress = progress
        self.interval = progress_interval
        self.planned = planned
        self.t0 = time.perf_counter()
        self.warm: list[Attempt] = []
        self.attempts: list[Attempt] = []
        self.tasks: dict[asyncio.Task[None], Attempt] = {}
        self.idle = asyncio.Event()  # set while no request task runs
        self.idle.set()
        self.completed = self.failed = 0
        self.ttfts: list[float] = []
        self._last_report = float("-inf")

    def now(self) -> float:
        return (time.perf_counter() - self.t0) * self.scale

    def _spawn(self, attempt: Attempt, holds_slot: bool) -> asyncio.Task[None]:
        task = asyncio.create_task(self._one(attempt, holds_slot))
        self.tasks[task] = attempt
        self.idle.clear()
        task.add_done_callback(self._done)
        return task

    async def _one(self, attempt: Attempt, holds_slot: bool) -> None:
        held = holds_slot
        try:
            if not held and self.sem is not None:
                await self.sem.acquire()
                held = True
            if self.stopping():  # queued for a slot when the stop came: never sent
                attempt.fail("cancelled: not sent, the run was stopped")
                return
            await run_attempt(self.session, self.base_url, attempt, self.options)
        finally:
            if held and self.sem is not None:
                self.sem.release()

    def _done(self, task: asyncio.Task[None]) -> None:
        attempt = self.tasks.pop(task)
        if not self.tasks:
            self.idle.set()
        if attempt.warmup:
            return
        if attempt.error is None and attempt.first is not None:
            self.completed += 1
            if attempt.sent is not None:
                self.ttfts.append(attempt.first - attempt.sent)
        else:
            self.failed += 1
        if self.rule is not None and not self.halt.is_set():
            self._tally(attempt.record())
            self.check()

    def _tally(self, rec: RequestRecord) -> None:
        """Count one finished request (its record's own figures, as the summary sees them)."""
        assert self.rule is not None
        t = self.tally
        if not rec.success:
            t.failed += 1
            t.over_length += rec.over_length
            t.errors += not rec.over_length
            return
        t.over_length += rec.truncated
        t.ttft_over += rec.ttft is not None and self.rule.exceeds_ttft(rec.ttft)
        t.tpot_over += rec.output_tokens > 1 and self.rule.exceeds_tpot(rec.tpot)

    def check(self) -> None:
        """Stop the run when the rule says its verdict is certain: requests in flight whose
        TTFT (known, or their age so far) exceeds the SLO count too, as ones that may fail."""
        rule = self.rule
        if rule is None or self.halt.is_set():
            return
        now, k = time.perf_counter(), self.scale
        bounds: dict[int, float | None] = {}
        pending = 0
        for a in self.tasks.values():
            if a.warmup:
                continue
            end = a.first if a.first is not None else now
            ttft = None if a.sent is None else (end - a.sent) * k
            bounds[id(a)] = ttft
            pending += ttft is not None and rule.exceeds_ttft(ttft)
        t = self.tally
        t.ttft_over += pending
        t.ttft_pending = pending
        reason = rule.verdict(t)
        t.ttft_over -= pending
        if reason is not None:
            self.reason, self.cut, self.halted_at = reason, bounds, now
            self.halt.set()

    async def watch(self) -> None:
        """Check the rule every few tens of ms: a request's age grows without any event."""
        while not self.halt.is_set():
            await asyncio.sleep(_WATCH_S)
            self.check()

    def stopping(self) -> bool:
        """True once the caller's stop event is set (noted the first time it is seen) or the
        early-stop rule stopped the run."""
        if self.halt.is_set():
            return True
        if self.stop is None or not self.stop.is_set():
            return False
        if self.stopped_at is None:
            self.stopped_at = time.perf_counter()
        return True

    def report(self, phase: Phase, force: bool = False) -> None:
        # Called from the run's own coroutine (never from request tasks), so an exception
        # in the callback surfaces from run_load instead of dying in a background task.
        if self.progress is None:
            return
        wall = time.perf_counter()
        if not force and wall - self._last_report < self.interval:
            return
        self._last_report = wall
        self.progress(
            ProgressSnapshot(
                phase=phase,
                elapsed=0.0 if phase == "warmup" else self.now(),
                planned=self.planned,
                sent=sum(1 for a in self.attempts if a.sent is not None),
                completed=self.completed,
                failed=self.failed,
                in_flight=sum(1 for a in self.tasks.values() if not a.warmup),
                p99_ttft_ms=(
                    float(np.percentile(self.ttfts, 99)) * 1e3 * self.scale if self.ttfts else None
                ),
            )
        )

    async def cancel(self, reason: str) -> None:
        """Cancel every running request, recording ``reason`` as its error."""
        pending = list(self.tasks)
        for task in pending:
            self.tasks[task].fail(reason)
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def wait_all(self, timeout: float, phase: Phase) -> bool:
        """Wait up to ``timeout`` wall seconds for running requests; True if all finished,
        False at the timeout or as soon as the stop event is set."""
        end = time.perf_counter() + timeout
        while self.tasks:
            left = end - time.perf_counter()
            if left <= 0 or self.stopping():
                return False
            events = [self.idle, self.halt] + ([self.stop] if self.stop is not None else [])
            waiters = [asyncio.ensure_future(e.wait()) for e in events]
            try:
                await asyncio.wait(
                    waiters,
                    timeout=min(left, max(self.interval, 0.01)),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for w in waiters:
                    w.cancel()
            self.report(phase)
        return True

    async def warmup(self, specs: Sequence[RequestSpec], n: int, timeout: float) -> None:
        """Copies of the first ``n`` requests (cycled), all at once within the slot limit:
        representative lengths warm the server's caches and graphs, not just one prompt."""
        for i in range(n):
            spec = specs[i % len(specs)]
            rid = f"warmup-{i}-{spec.request_id}"
            attempt = Attempt(
                spec, origin=self.t0, time_scale=self.scale, warmup=True, request_id=rid
            )
            self.warm.append(attempt)
            self._spawn(attempt, holds_slot=False)
        self.report("warmup", force=True)
        if not await self.wait_all(timeout, "warmup"):
            await self.cancel("cancelled: warm-up exceeded the drain timeout")

    def start_clock(self) -> None:
        self.t0 = time.perf_counter()
        for attempt in self.warm:  # warm-ups read as negative times before t0
            attempt.origin = self.t0

    def _start(self, spec: RequestSpec, scheduled_at: float, holds_slot: bool) -> None:
        attempt = Attempt(spec, origin=self.t0, time_scale=self.scale, scheduled_at=scheduled_at)
        self.attempts.append(attempt)
        self._spawn(attempt, holds_slot)
        self.report("run")

    async def schedule(self, specs: Sequence[RequestSpec], duration: float | None) -> None:
        for spec in specs:
            if self.stopping():
                return
            arrival = spec.arrival
            if arrival is None:  # closed loop: wait for a free slot, then send at once
                if self.sem is not None:
                    await self.sem.acquire()
                now = self.now()
                if (duration is not None and now >= duration) or self.stopping():
                    if self.sem is not None:
                        self.sem.release()
                    return
                self._start(spec, now, holds_slot=True)
                continue
            if duration is not None and arrival >= duration:
                continue  # arrives after the bound: not part of this run
            await sleep_until(self.t0 + arrival / self.scale)
            if self.stopping():
                return
            self._start(spec, arrival, holds_slot=False)

    async def schedule_until_stopped(
        self, specs: Sequence[RequestSpec], duration: float | None
    ) -> None:
        """:meth:`schedule`, cut short (its sleeps included) when the stop event is set or the
        early-stop rule stops the run."""
        if self.stop is None and self.rule is None:
            await self.schedule(specs, duration)
            return
        sched = asyncio.ensure_future(self.schedule(specs, duration))
        stoppers = [
            asyncio.ensure_future(e.wait()) for e in (self.stop, self.halt) if e is not None
        ]
        try:
            await asyncio.wait([sched, *stoppers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stopper in stoppers:
                stopper.cancel()
            if not sched.done():
                sched.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sched
        self.stopping()
        if not sched.cancelled():
            sched.result()  # an error in the schedule surfaces here


def _validate(
    max_concurrency: int | None,
    warmup: int,
    duration: float | None,
    drain_timeout: float,
    time_scale: float,
    endpoint: str,
) -> None:
    if max_concurrency is not None and max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be at least 1: {max_concurrency}")
    if warmup < 0:
        raise ConfigError(f"warmup must be a non-negative number of requests: {warmup}")
    if duration is not None and not duration > 0:
        raise ConfigError(f"duration must be positive: {duration}")
    if not drain_timeout >= 0:
        raise ConfigError(f"drain_timeout must be non-negative: {drain_timeout}")
    if not time_scale > 0:
        raise ConfigError(f"time_scale must be positive: {time_scale}")
    if endpoint not in ("completions", "chat"):
        raise ConfigError(f"unknown endpoint {endpoint!r}: expected 'completions' or 'chat'")


async def run_load(
    base_url: str,
    requests: Sequence[RequestSpec],
    *,
    model: str,
    endpoint: Endpoint = "completions",
    api_key: str | None = None,
    max_concurrency: int | None = None,
    warmup: int = 0,
    duration: float | None = None,
    drain_timeout: float = 30.0,
    time_scale: float = 1.0,
    progress: Callable[[ProgressSnapshot], None] | None = None,
    progress_interval: float = 0.5,
    request_timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    extra_body: Mapping[str, Any] | None = None,
    goodput_slos: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    stop: asyncio.Event | None = None,
    early_stop: StopRule | None = None,
) -> LoadResult:
    """Run ``requests`` against ``base_url`` and return every record with a summary.

    ``duration`` (engine seconds) stops sending: open-loop requests arriving at or after it
    and closed-loop requests that would start after it are not sent. ``drain_timeout``
    (wall seconds) then bounds the wait for requests in flight; the rest are cancelled and
    recorded as failed (``"cancelled: at drain timeout"``). Cancelling the caller's task
    cancels every request and closes the session before CancelledError propagates.

    ``stop`` (e.g. a worker's death event) ends the run early: once it is set nothing more is
    sent, requests in flight are cancelled and recorded as failed, and what completed is
    kept; :attr:`LoadResult.stopped_at` says when.

    ``early_stop`` ends the run the same way as soon as the level's verdict is certain
    (docs/tuning.md#10-early-stop-inside-a-level); the requests it cuts get no record, and
    :attr:`LoadResult.early_stop` says why and when.
    """
    _validate(max_concurrency, warmup, duration, drain_timeout, time_scale, endpoint)
    summarize([], 0.0, goodput_slos=goodput_slos, percentiles=percentiles)  # fail fast
    options = RequestOptions(
        model=model,
        endpoint=endpoint,
        api_key=api_key,
        timeout=request_timeout,
        stall_timeout=stall_timeout,
        temperature=temperature,
        ignore_eos=ignore_eos,
        extra_body=extra_body,
    )
    async with make_session(max_concurrency) as session:
        run = _Run(
            session,
            base_url,
            options,
            max_concurrency,
            time_scale,
            progress,
            progress_interval,
            planned=len(requests),
            stop=stop,
            early_stop=early_stop,
        )
        # A full collection walks every live object: with a large heap (the caller's workload,
        # earlier runs' records) that is a pause of tens of ms on the loop that sends on
        # schedule. Freezing moves what exists now out of the collector's reach for the run.
        gc.collect()
        gc.freeze()
        watcher: asyncio.Future[None] | None = None
        try:
            if warmup and requests:
                await run.warmup(requests, warmup, drain_timeout)
            run.start_clock()
            started_at = time.time()
            watcher = asyncio.ensure_future(run.watch()) if early_stop is not None else None
            await run.schedule_until_stopped(requests, duration)
            drained = run.stopping() or await run.wait_all(drain_timeout, "drain")
            if run.halt.is_set():
                await run.cancel(_EARLY)
            elif run.stopping():
                await run.cancel(_STOPPED)
            elif not drained:
                await run.cancel("cancelled: at drain timeout")
        finally:
            # Only non-empty on an error or cancellation path: leave no request task behind.
            await run.cancel("cancelled: load run aborted")
            if watcher is not None:
                watcher.cancel()
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
        goodput_slos=goodput_slos,
        percentiles=percentiles,
        time_scale=time_scale,
    )
    if (warning := length_warning(summary)) is not None:
        log.warning("%s", warning)
    ended: StopInfo | None = None
    if run.reason is not None and run.halted_at is not None:
        summary, ended = _stopped(run, summary, records, requests, wall)
    return LoadResult(
        records=records,
        duration=elapsed,
        summary=summary,
        time_scale=time_scale,
        started_at=started_at,
        warmup_records=len(run.warm),
        stopped_at=(None if run.stopped_at is None else (run.stopped_at - run.t0) * time_scale),
        origin=run.t0,
        early_stop=ended,
        wall_s=wall,
    )


def _stopped(
    run: _Run,
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
    )
