"""Reading ``/proc/PID/stat``: the one parser of it, for every caller that watches processes.

A zombie (state ``Z``, or ``X`` while it is torn down) has exited: it only waits for its
parent to collect its status, so it is dead for every purpose here
(docs/faults.md#3-no-orphaned-workers, docs/vllm.md#9-worker-death). :func:`is_alive` and
:func:`group_members` leave it out; :func:`group_stats` keeps it, for the caller that reaps
zombies.

Standard library only: the watchdog script (``_reaper.py watch``, run without autotune on its
path) loads this file beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "DEAD_STATES",
    "ProcStat",
    "group_members",
    "group_stats",
    "is_alive",
    "parse_stat",
    "read_stat",
]

DEAD_STATES = frozenset("ZX")


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/PID/stat`` line that the watchers use."""

    pid: int
    comm: str  # the command name (15 characters at most; may hold spaces and parentheses)
    state: str  # R, S, D, T, t, Z, X, ...
    ppid: int
    pgrp: int
    cpu_ticks: int  # utime + stime (fields 14 and 15), in clock ticks
    start_ticks: int  # field 22, clock ticks after boot: tells a reused pid apart
    exit_code: int | None  # field 52 (Linux >= 3.5): a zombie's wait status

    @property
    def dead(self) -> bool:
        """A zombie: it has exited (docs/vllm.md#9-worker-death)."""
        return self.state in DEAD_STATES


def parse_stat(line: str) -> ProcStat | None:
    """``line`` as read from ``/proc/PID/stat``; None when it is cut short.

    The command name is in parentheses and may itself hold spaces and parentheses, so it
    ends at the last ``)``."""
    head, sep, tail = line.rpartition(")")
    pid_text, open_paren, comm = head.partition(" (")
    fields = tail.split()
    if not sep or not open_paren or len(fields) < 20 or not pid_text.strip().isdigit():
        return None
    exit_text = fields[49] if len(fields) > 49 else ""
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        start_ticks=int(fields[19]),
        exit_code=int(exit_text) if exit_text.lstrip("-").isdigit() else None,
    )


def read_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat line; None when it is gone (or there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
    except OSError:
        return None
    return parse_stat(line)


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists in ``/proc`` and is no zombie."""
    stat = read_stat(pid)
    return stat is not None and not stat.dead


def group_stats(pgid: int) -> list[ProcStat] | None:
    """Every process of group ``pgid``, zombies included; None without ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out: list[ProcStat] = []
    for name in names:
        if not name.isdigit():
            continue
        stat = read_stat(int(name))  # None: it exited while we looked
        if stat is not None and stat.pgrp == pgid:
            out.append(stat)
    return out


def group_members(pgid: int, start: int | None) -> list[int]:
    """Pids of the live (not zombie) members of group ``pgid`` started no earlier than its
    leader did (``start``: the leader's start ticks; None takes every member)."""
    return [
        s.pid
        for s in group_stats(pgid) or ()
        if not s.dead and (start is None or s.start_ticks >= start)
    ]
