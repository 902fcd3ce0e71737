"""Telling a hung worker from a busy one, by its progress (docs/vllm.md#10-whose-death-is-it).

On two busy cores a healthy vLLM can take 3-7 s to answer a scrape, so a probe's timeout
says nothing by itself. What a working server never shows is the lack of progress:

- **frozen**: a process of the worker's group has been in state ``T``/``t`` (stopped, e.g.
  SIGSTOP) or ``D`` (uninterruptible sleep) at every sample for ``stall_s`` seconds, used no
  CPU time meanwhile, and no request completed in that time. A stopped API server serves
  nothing and a stopped EngineCore computes nothing, whatever the others do.
- **silent**: no process of the group used any CPU time for ``stall_s`` seconds, no request
  completed, and ``/health`` did not answer 200 in that time (a deadlock: every process
  sleeps, nobody answers).

A process that uses CPU time, or a server whose requests complete, is never flagged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.workers.procstat import read_stat

__all__ = ["STALL_S", "Stall", "StallWatch", "proc_state"]

STALL_S = 10.0
_FROZEN_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep"}


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state, CPU ticks used: utime + stime) of ``pid`` from ``/proc/PID/stat``; None when
    it is gone."""
    stat = read_stat(pid)
    return (stat.state, stat.cpu_ticks) if stat is not None else None


@dataclass(frozen=True)
class Stall:
    """Why the worker counts as hung."""

    message: str
    pid: int | None = None
    process: str | None = None


@dataclass
class _Proc:
    name: str
    ticks: int = -1
    frozen_since: float | None = None  # first sample in T/t/D with no CPU time since


class StallWatch:
    """Samples a worker's processes (``pid -> name``); :meth:`sample` says when it hangs.

    :meth:`note_progress` is called when a request completes, :meth:`note_health` when
    ``/health`` answers 200. Times are ``time.perf_counter()`` seconds."""

    def __init__(self, procs: Mapping[int, str], stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self.procs = {pid: _Proc(name) for pid, name in procs.items()}
        now = time.perf_counter()
        self.cpu_at = self.progress_at = self.health_at = now

    def note_progress(self, now: float | None = None) -> None:
        self.progress_at = time.perf_counter() if now is None else now

    def note_health(self, now: float | None = None) -> None:
        self.health_at = time.perf_counter() if now is None else now

    def sample(self, now: float | None = None) -> Stall | None:
        now = time.perf_counter() if now is None else now
        frozen: tuple[int, _Proc, str] | None = None  # the longest frozen process
        for pid, p in self.procs.items():
            got = proc_state(pid)
            if got is None:
                continue  # gone: the death watch reports exits
            state, ticks = got
            moved = ticks != p.ticks
            if moved:
                if p.ticks >= 0:
                    self.cpu_at = now
                p.ticks = ticks
            if state in _FROZEN_STATES and not (moved and p.frozen_since is not None):
                if p.frozen_since is None:
                    p.frozen_since = now
                if frozen is None or p.frozen_since < (frozen[1].frozen_since or now):
                    frozen = (pid, p, state)
            else:
                p.frozen_since = None
        quiet = now - self.progress_at
        silent = min(quiet, now - self.cpu_at, now - self.health_at)
        held = now - (frozen[1].frozen_since or now) if frozen is not None else 0.0
        if frozen is not None and (min(held, quiet) >= self.stall_s or silent >= self.stall_s):
            pid, p, state = frozen
            return Stall(
                f"{p.name.split()[0] if p.name else 'process'} (pid {pid}) hung: "
                f"{_FROZEN_STATES[state]} (state {state}) for {held:.1f} s, no CPU time, "
                f"no request completed",
                pid,
                p.name,
            )
        if silent >= self.stall_s:
            return Stall(
                f"worker hung: no CPU time, no request completed and no /health answer "
                f"for {silent:.1f} s"
            )
        return None
