"""How long this process's worker children lived, as the operating system records it: the
start in ``/proc/PID/stat`` (clock ticks after boot) to the moment the child was gone (a
zombie or reaped), on the boot-time clock. What autotune reports a worker cost must match
these lifetimes (docs/cost.md#1-what-is-counted)."""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

from autotune.workers.procstat import read_stat

from .processes import children_matching

__all__ = ["ChildLifetimes"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _boot_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class ChildLifetimes:
    """A thread that polls ``/proc`` every ``every_s`` for this process's children whose
    command line holds ``match`` (default: a ``serve`` argument, which ``vllm serve`` and
    ``autotune sim serve`` have and their engine processes have not). :attr:`lifetimes` maps
    each one's pid to its seconds from start to gone (children still running are left out)."""

    def __init__(self, match: bytes = b"\x00serve\x00", every_s: float = 0.02) -> None:
        self.match, self.every_s = match, every_s
        self._start: dict[int, float] = {}
        self._gone: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="child-lifetimes", daemon=True)

    def __enter__(self) -> ChildLifetimes:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # the last ones that ended

    @property
    def lifetimes(self) -> dict[int, float]:
        return {pid: self._gone[pid] - t0 for pid, t0 in self._start.items() if pid in self._gone}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._poll()

    def _poll(self) -> None:
        now = _boot_s()
        seen = {s.pid: s for s in children_matching(lambda cmd: self.match in cmd)}
        for pid, stat in seen.items():
            self._start.setdefault(pid, stat.start_ticks * _TICK_S)
        for pid, t0 in self._start.items():
            if pid not in seen and pid not in self._gone and self._exited(pid, t0):
                self._gone[pid] = now

    @staticmethod
    def _exited(pid: int, start_s: float) -> bool:
        """Gone, a zombie, or its pid reused. Not merely absent from one scan: a living
        child's command line can read empty for a moment (while the kernel holds its memory
        map), and one such scan made a 48-second server count as 0.04 seconds."""
        stat = read_stat(pid)
        return stat is None or stat.dead or stat.start_ticks * _TICK_S != start_s
