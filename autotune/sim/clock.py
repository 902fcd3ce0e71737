"""Clocks: the only time source of the simulated engine.

``VirtualClock`` jumps to the next event, so a trial runs as fast as the CPU allows;
``RealClock`` follows ``time.monotonic()`` with an optional time scale (the engine runs
``scale`` times faster than wall time) and sleeps with asyncio, for the HTTP server.
"""

from __future__ import annotations

import time

from autotune.timing import sleep_until

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
        # precise to tens of microseconds: tokens are released at the step's end
        await sleep_until(self.wall_at(t), time.monotonic)
