"""Precise asyncio waits, shared by the load generator (send times) and the simulated
server (step ends)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["SPIN_S", "sleep_until"]

# asyncio's epoll selector rounds timeouts UP to whole milliseconds, so a plain sleep wakes
# 0-1 ms late (p50 ~0.5 ms). Sleeping to SPIN_S before the target and then yielding to the
# loop until it arrives keeps wake-ups within tens of microseconds, while other tasks (HTTP
# streams) still run during the spin.
SPIN_S = 0.0015


async def sleep_until(target: float, now: Callable[[], float] = time.perf_counter) -> None:
    """Wait until ``now() >= target``; never returns early."""
    while (delay := target - now()) > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    while now() < target:
        await asyncio.sleep(0)
