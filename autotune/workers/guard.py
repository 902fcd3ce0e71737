"""Workers never outlive their controller (docs/faults.md#3-no-orphaned-workers).

Three defences, in the order they act:

1. every worker is launched through a tiny exec wrapper (``_reaper.py exec``) that sets
   ``PR_SET_PDEATHSIG``: the kernel sends the worker's leader SIGTERM when the controller's
   main thread dies, however it died;
2. a per-controller watchdog process (``_reaper.py watch``) holds a pipe from the
   controller and knows every live worker group: when the pipe closes it stops each whole
   group (the leader's children included, which the death signal never reaches);
3. each group is recorded in the database (host, process group, start time, temp folder,
   owning controller), and a controller starting on the same host reaps what a dead one
   left behind, checking a group's start time before signalling it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from autotune.workers.procstat import group_members, read_stat

__all__ = [
    "GroupRecord",
    "GroupRegistry",
    "Watchdog",
    "boot_id",
    "guarded_argv",
    "host_name",
    "proc_start_ticks",
    "process_alive",
    "remove_tmpdir",
    "stop_group",
]

log = logging.getLogger(__name__)

REAPER = Path(__file__).with_name("_reaper.py")
_LINUX = sys.platform.startswith("linux")


def proc_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (None: gone, or no /proc)."""
    stat = read_stat(pid)
    return stat.start_ticks if stat is not None else None


def boot_id() -> str | None:
    """This boot's id: start times only compare within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def host_name() -> str:
    return socket.gethostname()


def process_alive(pid: int, start: int | None, boot: str | None) -> bool:
    """Whether the process recorded as ``pid`` (started at ``start`` in boot ``boot``) still
    runs; a pid reused by another process, or a recorded boot that is over, is not it."""
    if boot is not None and boot_id() not in (None, boot):
        return False
    stat = read_stat(pid)
    if stat is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return start is None  # no /proc: the pid exists, which is all that can be known
    if stat.dead:
        return False
    return start is None or stat.start_ticks == start


def stop_group(pgid: int, start: int | None, boot: str | None, grace_s: float = 10.0) -> list[int]:
    """Stop a recorded group that is still ours: SIGTERM, SIGKILL after ``grace_s``.
    Returns the members that were signalled (empty: nothing of it ran, or it is not ours)."""
    if boot is not None and boot_id() not in (None, boot):
        return []  # the machine rebooted since: that group died with it
    leader = proc_start_ticks(pgid)
    if leader is not None and start is not None and leader != start:
        return []  # the leader's pid now belongs to another process
    found = group_members(pgid, start)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid, start):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(pgid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
    return found


def guarded_argv(argv: list[str]) -> list[str]:
    """``argv`` launched through the death-signal wrapper (Linux; elsewhere as is)."""
    if not _LINUX:
        return list(argv)
    return [sys.executable, "-I", "-S", str(REAPER), "exec", str(os.getpid()), "--", *argv]


@dataclass(frozen=True)
class GroupRecord:
    """A started worker's process group, as recorded and as reaped."""

    trial_name: str
    pgid: int
    proc_start: int | None
    boot_id: str | None
    host: str
    tmpdir: str | None


class GroupRegistry(Protocol):
    """Told about every worker group: right after launch, and once it is gone."""

    def spawned(self, group: GroupRecord) -> None: ...

    def gone(self, group: GroupRecord) -> None: ...


class Watchdog:
    """The controller's watchdog process (started at the first registration)."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _send(self, line: str) -> None:
        if not _LINUX:
            return
        if self._proc is None or self._proc.poll() is not None:
            # its own session: a terminal's Ctrl-C or hangup never reaches it
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(REAPER), "watch", f"{self.grace_s:g}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._pipe = self._proc.stdin
        assert self._pipe is not None
        try:
            self._pipe.write(line.encode())
            self._pipe.flush()
        except (BrokenPipeError, OSError):
            log.warning("the worker watchdog is gone; a new one starts with the next worker")
            self._proc = None

    def spawned(self, group: GroupRecord) -> None:
        start = group.proc_start if group.proc_start is not None else 0
        self._send(f"+ {group.pgid} {start} {group.tmpdir or '-'}\n")

    def gone(self, group: GroupRecord) -> None:
        if self._proc is not None:
            self._send(f"- {group.pgid}\n")

    def close(self) -> None:
        """End the watchdog (every group it knew is gone by now)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=self.grace_s + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def remove_tmpdir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)
