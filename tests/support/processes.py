"""Processes and ports: free loopback ports, gone pids and process groups, and the
``autotune sim serve`` children a test started."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from autotune.workers.procstat import ProcStat, read_stat

__all__ = ["children_matching", "children_serving", "free_port", "group_gone", "pid_gone"]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_gone(pgid: int) -> bool:
    """True when no process of the group is left (signal 0 finds none)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def children_matching(match: Callable[[bytes], bool]) -> list[ProcStat]:
    """This process's living children whose command line passes ``match``, as ``/proc``
    reads them (a zombie's command line is empty: it never matches)."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = read_stat(int(name))
        if stat is None or stat.ppid != me:
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if match(cmd):
            out.append(stat)
    return out


def children_serving() -> list[int]:
    """Pids of this process's children that run ``autotune sim serve``."""
    return [
        s.pid for s in children_matching(lambda cmd: b"serve" in cmd and b"autotune.cli" in cmd)
    ]
