"""How late the load generator's own event loop ran during a level
(docs/loadgen.md#5-client-limited-levels): a task that sleeps :data:`PERIOD_S` again and again
and records by how much each wake-up overshot. A loop that keeps its timers is free to read
its streams as they come; one whose wake-ups run late reads them late, in bursts. This is
what tells a client that could not keep up from a server that wrote its chunks together.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

__all__ = ["PERIOD_S", "LoopLagProbe"]

PERIOD_S = 0.01  # a wake-up every 10 ms: cheap, and finer than any stream's token gap


class LoopLagProbe:
    """Run as a task on the load generator's loop (:meth:`run`), cancelled at the end of
    the measured phase; :meth:`percentile_ms` reads the overshoots (wall ms)."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(PERIOD_S)
            self.lags_s.append(max(0.0, time.perf_counter() - t - PERIOD_S))

    def percentile_ms(self, p: float) -> float | None:
        """The ``p``-th percentile of the overshoots in wall ms; None with no wake-up yet."""
        if not self.lags_s:
            return None
        return float(np.percentile(np.asarray(self.lags_s) * 1000.0, p))
