"""Telling when a stopped worker's process group is empty: its zombies reaped where they are
ours to reap, counted as gone where they are not (a zombie has exited,
docs/vllm.md#9-worker-death)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

from autotune.workers.procstat import group_stats

__all__ = ["become_subreaper", "group_gone", "member_states", "reap_orphans", "signal_group"]

_PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Adopt our descendants' orphans (Linux), so their zombies can be reaped here.

    When a server's leader exits first, its children are re-parented. In containers PID 1 is
    often not an init that reaps, and a zombie still counts as a group member, so without
    this the group would never look empty. Process-wide and idempotent.
    """
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
            except (OSError, AttributeError):
                pass
    return _subreaper


def member_states(pgid: int) -> list[tuple[int, str, int]] | None:
    """``(pid, state, ppid)`` of every process in the group, zombies included, for a message;
    None without /proc."""
    stats = group_stats(pgid)
    return None if stats is None else [(s.pid, s.state, s.ppid) for s in stats]


def group_gone(leader: subprocess.Popen[bytes]) -> bool:
    """Whether nothing of ``leader``'s process group is left that holds memory or a port;
    reaps the leader and the group's zombies that were re-parented to us on the way."""
    pgid = leader.pid
    leader.poll()  # reap the leader: a zombie leader keeps the group alive
    reap_orphans(pgid, leader.pid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a member we may not signal exists
    me = os.getpid()
    members = group_stats(pgid)
    # Zombies whose parent is not us (no subreaper here) and does not reap them, as PID 1
    # in many containers, are dead already: nothing is left that holds memory or a
    # port. Our own zombies are reaped on the next pass.
    return members is not None and all(m.state == "Z" and m.ppid != me for m in members)


def reap_orphans(pgid: int, leader_pid: int) -> None:
    """Reap zombies of the group that were re-parented to us (see :func:`become_subreaper`).
    The leader is left to Popen, whose returncode would be lost otherwise."""
    me = os.getpid()
    for m in group_stats(pgid) or ():
        if m.state == "Z" and m.ppid == me and m.pid != leader_pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(m.pid, os.WNOHANG)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
