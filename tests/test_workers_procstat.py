"""The one ``/proc/PID/stat`` reader (autotune.workers.procstat): command names with spaces
and parentheses, lines cut short, and a zombie counting as dead
(docs/vllm.md#9-worker-death)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from autotune.workers.procstat import (
    ProcStat,
    group_members,
    group_stats,
    is_alive,
    parse_stat,
    read_stat,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _line(pid: int, comm: str, state: str, *, exit_code: int = 0) -> str:
    """A stat line as Linux writes it: 52 fields, ppid 1, pgrp 1234, utime 7, stime 5,
    start ticks 9000."""
    rest = ["0"] * 49  # fields 4..52
    rest[0], rest[1] = "1", "1234"  # ppid, pgrp
    rest[10], rest[11] = "7", "5"  # utime, stime
    rest[18] = "9000"  # starttime
    rest[48] = str(exit_code)
    return f"{pid} ({comm}) {state} {' '.join(rest)}\n"


def test_a_command_name_with_spaces_and_parentheses_ends_at_the_last_parenthesis() -> None:
    got = parse_stat(_line(1234, "vllm (x) y", "Z", exit_code=9))
    assert got == ProcStat(
        pid=1234,
        comm="vllm (x) y",
        state="Z",
        ppid=1,
        pgrp=1234,
        cpu_ticks=12,
        start_ticks=9000,
        exit_code=9,
    )
    assert got.dead


def test_a_plain_running_process_is_not_dead() -> None:
    got = parse_stat(_line(42, "VLLM::EngineCore", "R"))
    assert got is not None and got.comm == "VLLM::EngineCore" and not got.dead
    assert got.pgrp == 1234 and got.start_ticks == 9000


def test_states_z_and_x_are_dead_the_others_are_not() -> None:
    for state, dead in (("Z", True), ("X", True), ("R", False), ("S", False), ("D", False)):
        got = parse_stat(_line(7, "sleep", state))
        assert got is not None and got.dead is dead, state


def test_a_line_cut_short_or_without_a_command_name_reads_as_none() -> None:
    assert parse_stat("") is None
    assert parse_stat("1234 (x) S 1 2 3") is None
    assert parse_stat("1234 x S " + " ".join(["0"] * 50)) is None


def test_an_old_kernel_without_the_exit_code_field_reads_none_for_it() -> None:
    short = " ".join(_line(5, "a b", "Z").split()[:45])
    got = parse_stat(short)
    assert got is not None and got.exit_code is None and got.dead


@linux
def test_this_process_reads_as_alive_and_a_gone_pid_as_none() -> None:
    me = read_stat(os.getpid())
    assert me is not None and me.pid == os.getpid() and not me.dead
    assert is_alive(os.getpid())
    assert read_stat(2**22 + 12345) is None and not is_alive(2**22 + 12345)


@linux
def test_a_real_zombie_child_is_dead_and_shows_its_exit_status() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.exit(3)"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        stat = read_stat(child.pid)
        while stat is not None and not stat.dead and time.monotonic() < deadline:
            time.sleep(0.02)
            stat = read_stat(child.pid)
        # not yet waited for: a zombie, still in /proc, dead all the same
        assert stat is not None and stat.state == "Z" and stat.dead
        assert not is_alive(child.pid)
        assert stat.exit_code in (None, 3 << 8)
        # its group still lists it, but not among the live members
        assert [s.pid for s in group_stats(child.pid) or ()] == [child.pid]
        assert group_members(child.pid, None) == []
    finally:
        assert child.wait(timeout=30) == 3
    assert read_stat(child.pid) is None
