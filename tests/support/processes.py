"""Processes and ports: free loopback ports, gone pids and process groups, and the
``autotune sim serve`` children a test started."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from autotune.workers.procstat import read_stat

__all__ = ["children_serving", "free_port", "group_gone", "pid_gone"]


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


def children_serving() -> list[int]:
    """Pids of this process's children that run ``autotune sim serve``."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = read_stat(int(name))
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if stat is not None and stat.ppid == me and b"serve" in cmd and b"autotune.cli" in cmd:
            out.append(int(name))
    return out
