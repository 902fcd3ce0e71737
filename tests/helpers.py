"""Small helpers several test modules share (processes, ports)."""

from __future__ import annotations

import os
import socket

__all__ = ["free_port", "group_gone", "pid_gone"]


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
