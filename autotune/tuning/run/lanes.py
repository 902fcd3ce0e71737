"""Parallel trials on one host: ``autotune study run NAME --gpus 0,1,2,3`` (docs/parallel.md).

The devices are split into *lanes* of ``--gpus-per-trial`` devices each (what a trial's
parallel sizes need, when the study sets them). A lane runs one trial at a time with its own
runner, hence its own worker process, port, work folder and ``CUDA_VISIBLE_DEVICES``; no
two lanes share a device, so no two running trials ever do. All lanes claim their trials
through the controller's one :class:`~autotune.tuning.run.claims.Claims`, so the budget stays
exact however many lanes (and controllers on other hosts) share the study.

Each lane runs in a thread of its own with its own event loop (:func:`run_lanes`). One loop
for every lane would let one lane's blocking work (the claim under the study lock, each
level's database writes, the in-process simulator) stall the other lanes' load generators,
and every request they were timing would read slower than the server served it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import ConfigError
from autotune.tuning.search.parallelism import tp_candidates
from autotune.tuning.search.plan import model_of
from autotune.workers.devices import PARALLEL_FLAGS, flag_name, world_size

__all__ = [
    "PARALLEL_FLAGS",
    "LanePlan",
    "RunBudget",
    "implied_per_trial",
    "parse_devices",
    "plan_lanes",
    "run_lanes",
    "world_size",
]

# A device: an index or a UUID (``GPU-8f3c...``, ``MIG-...``), as CUDA_VISIBLE_DEVICES takes.
_DEVICE = re.compile(r"^[A-Za-z0-9_-]+$")


def parse_devices(text: str) -> tuple[str, ...]:
    """``--gpus`` text as device names; ValueError (one line) when it is not a device list."""
    if text == "all":  # the CLI resolves it first (autotune.workers.gpu_discovery)
        raise ValueError(
            "'all' names no device: `autotune study run --gpus all` resolves it to the "
            "devices this host was given before a run"
        )
    names = text.split(",")
    if not text or not all(_DEVICE.match(n) for n in names):
        raise ValueError(
            f"{text!r} is not a device list: write indices or UUIDs separated by commas, "
            "e.g. '0,1,2,3'"
        )
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{text!r} lists device {n} twice: a device belongs to one lane")
        seen.add(n)
    return tuple(names)


def implied_per_trial(cfg: StudyConfig) -> tuple[int, str] | None:
    """The devices per trial the study itself implies, and where that comes from: its
    parallel sizes in ``worker.static_args`` and, for a ``search.extra`` parameter, the
    largest choice (a lane must fit every trial)."""
    n, where = 1, []
    for k, v in cfg.worker.static_args.items():
        if flag_name(k) in PARALLEL_FLAGS and v is not None:
            n *= int(v)
            where.append(f"worker.static_args.{k} {v}")
    for extra in cfg.search.extra:
        if flag_name(extra.name) in PARALLEL_FLAGS:
            top = max(int(c) for c in extra.choices)
            n *= top
            where.append(f"search.extra {extra.name} (largest choice {top})")
    if cfg.search.parallelism is not None:
        # the parallelism stage's largest size (docs/tuning.md#16-the-parallelism-stage)
        top = tp_candidates(model_of(cfg), cfg.search.parallelism)[-1]
        n *= top
        where.append(f"search.parallelism {cfg.search.parallelism} (largest size {top})")
    return (n, " x ".join(where)) if where else None


@dataclass(frozen=True)
class LanePlan:
    """The devices of each lane; ``per_trial`` of them each."""

    lanes: tuple[tuple[str, ...], ...]
    per_trial: int

    def devices_for(self, lane: int, args: Mapping[str, Any]) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` of a trial with ``args`` (static and engine args) on
        ``lane``: the lane's devices, only the first ones when the trial needs fewer (a
        ``search.extra`` choice smaller than the largest)."""
        devs = self.lanes[lane]
        need = world_size(args)
        return ",".join(devs[:need] if need is not None and need < len(devs) else devs)


def plan_lanes(gpus: str, per_trial: int | None, cfg: StudyConfig) -> LanePlan:
    """Split ``--gpus`` into lanes of ``--gpus-per-trial`` devices (implied by the study's
    parallel sizes when not given). One :class:`ConfigError` line for each way it cannot."""
    try:
        devices = parse_devices(gpus)
    except ValueError as exc:
        raise ConfigError(f"--gpus: {exc}") from None
    implied = implied_per_trial(cfg)
    if per_trial is not None and per_trial < 1:
        raise ConfigError(f"--gpus-per-trial: {per_trial} is not a positive number of devices")
    if implied is not None and per_trial is not None and per_trial != implied[0]:
        raise ConfigError(
            f"--gpus-per-trial {per_trial} conflicts with {implied[1]}: a trial needs "
            f"{implied[0]} device(s); drop --gpus-per-trial or make it {implied[0]}"
        )
    k = per_trial if per_trial is not None else implied[0] if implied is not None else 1
    if len(devices) % k:
        source = f"--gpus-per-trial {k}" if implied is None else f"{implied[1]}, {k} device(s),"
        raise ConfigError(
            f"{source} does not divide the {len(devices)} device(s) of --gpus {gpus}: "
            "every trial gets exactly its share, so give a multiple of it"
        )
    lanes = tuple(devices[i : i + k] for i in range(0, len(devices), k))
    return LanePlan(lanes, k)


class RunBudget:
    """A run's limits, shared by its lanes: at most ``n_trials`` claims, none after
    ``timeout`` seconds. A lane reserves a trial before it claims one, so lanes that claim
    at once never overshoot ``n_trials``."""

    def __init__(self, n_trials: int | None, timeout: float | None) -> None:
        self.limit = n_trials if n_trials is not None else float("inf")  # the plan caps
        self.timeout, self.t0 = timeout, time.monotonic()
        self.reserved = self.ran = 0
        self._lock = threading.Lock()

    def reserve(self) -> str | None:
        """None: go ahead and claim; else why the run ends ("n_trials", "timeout")."""
        with self._lock:
            if self.reserved >= self.limit:
                return "n_trials"
            if self.timeout is not None and time.monotonic() - self.t0 >= self.timeout:
                return "timeout"
            self.reserved += 1
            return None

    def release(self) -> None:
        """The reserved trial was not claimed (nothing to claim now)."""
        with self._lock:
            self.reserved -= 1

    def finished(self) -> None:
        with self._lock:
            self.ran += 1


class _Lane:
    """One lane's thread and event loop; ``cancel`` may be called from any thread."""

    def __init__(self, index: int, body: Callable[[], Awaitable[Any]]) -> None:
        self.index, self._body = index, body
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.value: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        # daemon: a forced exit never waits for a lane (the watchdog stops its workers)
        self._thread = threading.Thread(
            target=self._main, name=f"autotune-lane-{index}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            self.value = asyncio.run(self._run())
        except BaseException as exc:  # handed to the controller's loop, raised there
            self.error = exc
        finally:
            self.done.set_result(None)

    async def _run(self) -> Any:
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            if self._cancelled:
                raise asyncio.CancelledError
        return await self._body()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._loop is not None and self._task is not None:
                with contextlib.suppress(RuntimeError):  # its loop has closed: it is done
                    self._loop.call_soon_threadsafe(self._task.cancel)


async def _all_unwound(waits: Sequence[asyncio.Future[None]]) -> None:
    """Wait until every lane has finished unwinding, whatever cancels the wait meanwhile:
    a lane's worker must be stopped and its trial failed before the run ends."""
    while not all(w.done() for w in waits):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(waits)


async def run_lanes(
    bodies: Sequence[Callable[[], Awaitable[Any]]],
    on_halt: Callable[[BaseException], None] | None = None,
) -> list[Any]:
    """Run every body at once, each in its own thread and event loop; returns their values.

    The first lane to raise stops the others: ``on_halt`` is told the error, the others are
    cancelled (as Ctrl-C cancels a run: their trials unwind) and, once every lane has
    unwound, the error is raised here. Cancelling this coroutine (Ctrl-C, SIGTERM) cancels
    every lane the same way and returns only after all of them unwound.
    """
    lanes = [_Lane(i, body) for i, body in enumerate(bodies)]
    for lane in lanes:
        lane.start()
    waits = [asyncio.wrap_future(lane.done) for lane in lanes]
    try:
        pending: set[asyncio.Future[None]] = set(waits)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = next((lane.error for lane in lanes if lane.error is not None), None)
            if failed is not None:
                if on_halt is not None:
                    on_halt(failed)
                for lane in lanes:
                    lane.cancel()
                await _all_unwound(waits)
                raise failed
    except BaseException:
        for lane in lanes:
            lane.cancel()
        await _all_unwound(waits)
        raise
    return [lane.value for lane in lanes]
