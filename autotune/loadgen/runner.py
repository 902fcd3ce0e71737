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
import gc
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
from autotune.loadgen.metrics import DEFAULT_PERCENTILES, RequestRecord, summarize, windowed
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.spec import RequestSpec
from autotune.timing import sleep_until

__all__ = ["LoadResult", "ProgressSnapshot", "ServerInfo", "probe_server", "run_load"]

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
    ) -> None:
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
        self.completed = self.failed = 0
        self.ttfts: list[float] = []
        self._last_report = float("-inf")

    def now(self) -> float:
        return (time.perf_counter() - self.t0) * self.scale

    def _spawn(self, attempt: Attempt, holds_slot: bool) -> asyncio.Task[None]:
        task = asyncio.create_task(self._one(attempt, holds_slot))
        self.tasks[task] = attempt
        task.add_done_callback(self._done)
        return task

    async def _one(self, attempt: Attempt, holds_slot: bool) -> None:
        held = holds_slot
        try:
            if not held and self.sem is not None:
                await self.sem.acquire()
                held = True
            await run_attempt(self.session, self.base_url, attempt, self.options)
        finally:
            if held and self.sem is not None:
                self.sem.release()

    def _done(self, task: asyncio.Task[None]) -> None:
        attempt = self.tasks.pop(task)
        if attempt.warmup:
            return
        if attempt.error is None and attempt.first is not None:
            self.completed += 1
            if attempt.sent is not None:
                self.ttfts.append(attempt.first - attempt.sent)
        else:
            self.failed += 1

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
                p99_ttft_ms=(float(np.percentile(self.ttfts, 99)) * 1e3 * self.scale
                             if self.ttfts else None),
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
        """Wait up to ``timeout`` wall seconds for running requests; True if all finished."""
        end = time.perf_counter() + timeout
        while self.tasks:
            left = end - time.perf_counter()
            if left <= 0:
                return False
            await asyncio.wait(list(self.tasks), timeout=min(left, max(self.interval, 0.01)))
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
            arrival = spec.arrival
            if arrival is None:  # closed loop: wait for a free slot, then send at once
                if self.sem is not None:
                    await self.sem.acquire()
                now = self.now()
                if duration is not None and now >= duration:
                    if self.sem is not None:
                        self.sem.release()
                    return
                self._start(spec, now, holds_slot=True)
                continue
            if duration is not None and arrival >= duration:
                continue  # arrives after the bound: not part of this run
            await sleep_until(self.t0 + arrival / self.scale)
            self._start(spec, arrival, holds_slot=False)


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
) -> LoadResult:
    """Run ``requests`` against ``base_url`` and return every record with a summary.

    ``duration`` (engine seconds) stops sending: open-loop requests arriving at or after it
    and closed-loop requests that would start after it are not sent. ``drain_timeout``
    (wall seconds) then bounds the wait for requests in flight; the rest are cancelled and
    recorded as failed (``"cancelled: at drain timeout"``). Cancelling the caller's task
    cancels every request and closes the session before CancelledError propagates.
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
        )
        # A full collection walks every live object: with a large heap (the caller's workload,
        # earlier runs' records) that is a pause of tens of ms on the loop that sends on
        # schedule. Freezing moves what exists now out of the collector's reach for the run.
        gc.collect()
        gc.freeze()
        try:
            if warmup and requests:
                await run.warmup(requests, warmup, drain_timeout)
            run.start_clock()
            started_at = time.time()
            await run.schedule(requests, duration)
            if not await run.wait_all(drain_timeout, "drain"):
                await run.cancel("cancelled: at drain timeout")
        finally:
            # Only non-empty on an error or cancellation path: leave no request task behind.
            await run.cancel("cancelled: load run aborted")
            gc.unfreeze()
    records = [a.record() for a in run.warm] + [a.record() for a in run.attempts]
    measured = records[len(run.warm) :]
    elapsed = max((r.finished_at for r in measured), default=0.0)
    run.report("done", force=True)
    return LoadResult(
        records=records,
        duration=elapsed,
        summary=summarize(
            records,
            elapsed,
            goodput_slos=goodput_slos,
            percentiles=percentiles,
            time_scale=time_scale,
        ),
        time_scale=time_scale,
        started_at=started_at,
        warmup_records=len(run.warm),
    )
