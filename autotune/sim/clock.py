"""Clocks: the only time source of the simulated engine.

``VirtualClock`` jumps to the next event, so a trial runs as fast as the CPU allows;
``RealClock`` follows ``time.monotonic()`` with an optional time scale (the engine runs
``scale`` times faster than wall time) and sleeps with asyncio, for the HTTP server.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Clock", "RealClock", "VirtualClock"]


class Clock:
    def now(self) -> float:
        raise NotImplementedError

    async def sleep_until(self, t: float) -> None:
        raise NotImplementedError


class VirtualClock(Clock):
    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t > self._t:
            self._t = t

    async def sleep_until(self, t: float) -> None:
        self.advance_to(t)


class RealClock(Clock):
    """Engine seconds = wall seconds x ``scale`` since construction."""

    SPIN_S = 0.0015

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.scale

    def wall_at(self, t: float) -> float:
        return self._t0 + t / self.scale

    async def sleep_until(self, t: float) -> None:
        # asyncio's epoll selector rounds timeouts up to whole milliseconds; tokens would be
        # released up to 1 ms late. Sleep to SPIN_S before the step's end, then yield to the
        # loop (HTTP handlers keep running) until it is reached.
        target = self.wall_at(t)
        while (delay := target - time.monotonic()) > self.SPIN_S:
            await asyncio.sleep(delay - self.SPIN_S)
        while time.monotonic() < target:
            await asyncio.sleep(0)
