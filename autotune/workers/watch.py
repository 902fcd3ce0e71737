"""Noticing that a started worker died, while load runs against it.

A worker counts as dead when any of these holds (docs/vllm.md#9-worker-death):

- its leader (the API server) exits;
- a process that was in its process group when ``/health`` first answered 200 exits (vLLM's
  EngineCore and its workers: when the EngineCore dies, the API server stays up a few seconds
  and answers ``/health`` with 503, so watching the leader alone is not enough);
- ``/health`` fails 3 times in a row over at least 2 s (an error status or a refused
  connection; a probe that times out is no failure: a busy server answers late);
- ``EngineDeadError`` appears in its log;
- it hangs: it makes no progress for 10 s (:mod:`autotune.workers.stall`: a process stopped
  or stuck in uninterruptible sleep, no CPU time, no request completed).

The first condition seen is the cause. An exit status is exact for the leader (our child);
another member's is read from ``/proc`` while it is a zombie, which its parent usually
reaps within milliseconds, so it is often unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from autotune.workers.procstat import group_stats, read_stat
from autotune.workers.stall import STALL_S, StallWatch

__all__ = [
    "DeathReport",
    "DeathWatch",
    "ProcInfo",
    "WorkerDeath",
    "describe_status",
    "snapshot_group",
]

Cause = Literal["leader_exit", "process_exit", "health", "engine_dead_log", "hung"]

ENGINE_DEAD_TEXT = "EngineDeadError"


@dataclass(frozen=True)
class ProcInfo:
    """A group member as seen when the worker became ready."""

    pid: int
    start_time: int  # clock ticks after boot (/proc/PID/stat field 22): tells pid reuse apart
    name: str  # its command line (vLLM retitles its processes: "VLLM::EngineCore")


@dataclass(frozen=True)
class WorkerDeath:
    """Why a worker counts as dead, as exactly as it is known."""

    cause: Cause
    message: str  # one line for progress output and the stored failure
    detected_at: float  # time.perf_counter() when the watch saw it
    pid: int | None = None
    process: str | None = None
    returncode: int | None = None  # Popen's convention: negative = killed by that signal
    signal: str | None = None  # "SIGKILL" when a signal ended the process
    # time.time() when seen: lines up with what happened outside this process (the faults
    # ledger measures detection from the moment of the fault)
    detected_wall: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeathReport:
    """What is stored about a death: the watch's facts, the failure class the worker's log
    gave it, the log's classified (or last error) line and the log around it."""

    death: WorkerDeath
    failure_class: str
    log_line: str | None
    log_context: str


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80]


def snapshot_group(pgid: int) -> dict[int, ProcInfo]:
    """Every live member of process group ``pgid`` (empty without ``/proc``)."""
    return {
        s.pid: ProcInfo(s.pid, s.start_ticks, _cmdline(s.pid) or s.comm)
        for s in group_stats(pgid) or ()
        if not s.dead
    }


def describe_status(returncode: int | None) -> tuple[str, str | None]:
    """``("killed by SIGKILL", "SIGKILL")`` / ``("exited with code 1", None)`` for a Popen
    return code; ``("exited (status unknown)", None)`` for None."""
    if returncode is None:
        return "exited (status unknown)", None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}", name
    return f"exited with code {returncode}", None


def _member_exit(info: ProcInfo) -> tuple[bool, int | None]:
    """(exited?, Popen-style return code when a zombie still shows it)."""
    stat = read_stat(info.pid)
    if stat is None or stat.start_ticks != info.start_time:
        return True, None
    if not stat.dead:
        return False, None
    status = stat.exit_code  # a zombie's wait status
    if status is None:
        return True, None
    if status & 0x7F:
        return True, -(status & 0x7F)
    return True, (status >> 8) & 0xFF


class DeathWatch:
    """Polls one started worker until it dies (or the task running :meth:`run` is
    cancelled); then :attr:`death` says why and :attr:`event` is set."""

    def __init__(
        self,
        leader: subprocess.Popen[bytes],
        members: Mapping[int, ProcInfo],
        *,
        health_url: str,
        log_path: Path,
        poll_s: float = 0.02,
        log_every_s: float = 0.1,
        health_every_s: float = 1.0,
        health_timeout_s: float = 10.0,
        health_failures: int = 3,
        health_span_s: float = 2.0,
        stall_s: float = STALL_S,
        stall_every_s: float = 0.25,
    ) -> None:
        self.leader = leader
        self.members = {pid: m for pid, m in members.items() if pid != leader.pid}
        self.leader_name = (members.get(leader.pid) or ProcInfo(leader.pid, 0, "leader")).name
        self.health_url, self.log_path = health_url, log_path
        # processes are polled often: a killed EngineCore stays a zombie (its exit status
        # readable) only until the API server reaps it, ~35 ms on vLLM 0.32
        self.poll_s, self.log_every_s, self.health_every_s = poll_s, log_every_s, health_every_s
        self._last_log = float("-inf")
        self.health_timeout_s = health_timeout_s
        self.health_failures, self.health_span_s = health_failures, health_span_s
        self.event = asyncio.Event()
        self.death: WorkerDeath | None = None
        self._fails: list[float] = []
        self._last_health = float("-inf")
        self._offset = 0
        self._partial = b""
        names = {leader.pid: "API server"} | {p: m.name for p, m in self.members.items()}
        self.stall = StallWatch(names, stall_s)
        self.stall_every_s = stall_every_s
        self._last_stall = float("-inf")

    def note_progress(self) -> None:
        """A request completed: the server makes progress (see :mod:`autotune.workers.stall`)."""
        self.stall.note_progress()

    def check_stall(self) -> None:
        stall = self.stall.sample()
        if stall is not None:
            self._die("hung", stall.message, pid=stall.pid, process=stall.process)

    def _die(self, cause: Cause, message: str, **kw: Any) -> None:
        if self.death is None:
            self.death = WorkerDeath(cause, message, time.perf_counter(), **kw)
            self.event.set()

    def check_processes(self) -> None:
        rc = self.leader.poll()
        if rc is not None:
            what, sig = describe_status(rc)
            self._die(
                "leader_exit",
                f"API server (pid {self.leader.pid}) {what}",
                pid=self.leader.pid,
                process=self.leader_name,
                returncode=rc,
                signal=sig,
            )
            return
        for info in self.members.values():
            gone, code = _member_exit(info)
            if gone:
                what, sig = describe_status(code)
                self._die(
                    "process_exit",
                    f"{info.name.split()[0]} (pid {info.pid}) {what}",
                    pid=info.pid,
                    process=info.name,
                    returncode=code,
                    signal=sig,
                )
                return

    def check_log(self) -> None:
        """Look for ``EngineDeadError`` in what the log gained since the last look."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self._offset += len(data)
        text = self._partial + data
        lines = text.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if ENGINE_DEAD_TEXT.encode() in raw:
                line = raw.decode(errors="replace").strip()
                self._die("engine_dead_log", f"EngineDeadError in the worker log: {line[:200]}")
                return

    def _health_result(self, ok: bool | None) -> None:
        """``ok`` None: the probe timed out, which counts neither way (a busy server answers
        late; a hung one is found by its lack of progress)."""
        now = time.perf_counter()
        if ok is None:
            return
        if ok:
            self._fails.clear()
            self.stall.note_health(now)
            return
        self._fails.append(now)
        if (
            len(self._fails) >= self.health_failures
            and self._fails[-1] - self._fails[0] >= self.health_span_s
        ):
            self._die(
                "health",
                f"/health failed {len(self._fails)} times in a row over "
                f"{self._fails[-1] - self._fails[0]:.1f} s",
            )

    async def _probe(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(
                self.health_url, timeout=aiohttp.ClientTimeout(total=self.health_timeout_s)
            ) as resp:
                ok: bool | None = resp.status == 200
        except TimeoutError:
            ok = None
        except (aiohttp.ClientError, OSError):
            ok = False
        self._health_result(ok)

    async def run(self) -> None:
        """Poll until the worker dies; returns then (cancel it to stop watching)."""
        probe: asyncio.Task[None] | None = None
        async with aiohttp.ClientSession(trust_env=False) as session:
            try:
                while self.death is None:
                    self.check_processes()
                    now = time.perf_counter()
                    if self.death is None and now - self._last_log >= self.log_every_s:
                        self._last_log = now
                        self.check_log()
                    if self.death is None and now - self._last_stall >= self.stall_every_s:
                        self._last_stall = now
                        self.check_stall()
                    if (
                        self.death is None
                        and (probe is None or probe.done())
                        and now - self._last_health >= self.health_every_s
                    ):
                        self._last_health = now
                        probe = asyncio.create_task(self._probe(session))
                    if self.death is None:
                        await asyncio.sleep(self.poll_s)
            finally:
                if probe is not None and not probe.done():
                    probe.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probe
