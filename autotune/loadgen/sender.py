"""One load run's sending side: the arrival schedule (open loop on the monotonic clock,
closed loop on free slots), the request tasks and their ``max_concurrency`` slots, the
warm-up, the drain, the caller's stop event and the early-stop watch
(docs/tuning.md#10-early-stop-inside-a-level), and the progress snapshots it reports.
:func:`autotune.loadgen.runner.run_load` drives a :class:`LoadRun` and assembles its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp
import numpy as np

from autotune.loadgen.bench_stats import RequestRecord
from autotune.loadgen.client import Attempt, RequestOptions, run_attempt
from autotune.loadgen.spec import RequestSpec
from autotune.loadgen.stop_rule import StopRule, Tally
from autotune.loadgen.verdict_point import VerdictAt
from autotune.timing import sleep_until

__all__ = ["EARLY_STOPPED", "STOPPED", "LoadRun", "Phase", "ProgressSnapshot"]

STOPPED = "cancelled: the run was stopped (stop event set)"
EARLY_STOPPED = "cancelled: early stop, the level's verdict is certain"
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


class LoadRun:
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
        observe: StopRule | None = None,
    ) -> None:
        self.stop = stop
        self.stopped_at: float | None = None  # perf_counter() when the stop was seen
        # observing: the rule only notes where it would stop (``observed``), never halts
        self.observing = early_stop is None and observe is not None
        self.rule = early_stop or observe
        self.observed: VerdictAt | None = None
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
        if self.watching:
            self._tally(attempt.record())
            self.check()

    @property
    def watching(self) -> bool:
        """The rule still has a verdict to find: it neither stopped the run nor, observing,
        noted where it would have."""
        return self.rule is not None and not self.halt.is_set() and self.observed is None

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
        if rule is None or not self.watching:
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
        if reason is not None and self.observing:
            sent = sum(1 for a in self.attempts if a.sent is not None)
            self.observed = VerdictAt(reason, sent, self.planned)
        elif reason is not None:
            self.reason, self.cut, self.halted_at = reason, bounds, now
            self.halt.set()

    async def watch(self) -> None:
        """Check the rule every few tens of ms: a request's age grows without any event."""
        while self.watching:
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
