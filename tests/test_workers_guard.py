"""No worker outlives its controller (docs/faults.md#3-no-orphaned-workers): the death
signal through the exec wrapper, the watchdog that stops whole groups (a grandchild that
ignores SIGTERM included), start-time checks before signalling, and the reaping a starting
controller does for a dead one on its host."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.studies import config

from autotune.store import Store
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.workers.guard import (
    boot_id,
    guarded_argv,
    host_name,
    proc_start_ticks,
    process_alive,
    stop_group,
)
from autotune.workers.procstat import is_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

# A parent standing in for a controller: it launches a worker, prints the pids to watch,
# then waits to be killed. "wrapper": through the death-signal wrapper only; "watchdog": a
# plain launch whose leader starts a grandchild that ignores SIGTERM, known to a watchdog.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from autotune.workers.guard import GroupRecord, Watchdog, guarded_argv, proc_start_ticks
    mode = sys.argv[1]
    if mode == "wrapper":
        child = subprocess.Popen(guarded_argv(["sleep", "60"]), start_new_session=True)
        time.sleep(0.5)  # the wrapper has exec'd sleep by now
        print(child.pid, flush=True)
    else:
        leader = subprocess.Popen(
            [sys.executable, "-c",
             "import signal, subprocess, sys, time\\n"
             "g = subprocess.Popen(['sleep', '60'],"
             " preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))\\n"
             "print(g.pid, flush=True)\\n"
             "time.sleep(60)\\n"],
            stdout=subprocess.PIPE, start_new_session=True, text=True,
        )
        grandchild = leader.stdout.readline().strip()
        dog = Watchdog(grace_s=1.0)
        dog.spawned(GroupRecord("trial-0000", leader.pid, proc_start_ticks(leader.pid),
                                None, "h", None))
        print(leader.pid, grandchild, dog.pid, flush=True)
    time.sleep(60)
""")


def start_parent(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    parent.stdout.close()
    assert pids, "the parent printed no pids"
    return parent, pids


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(not is_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_the_death_signal_stops_the_worker_when_its_controller_is_killed(
    tmp_path: Path,
) -> None:
    parent, (worker,) = start_parent(tmp_path, "wrapper")
    assert Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"sleep\0")  # exec'd
    parent.kill()
    parent.wait()
    assert gone_within([worker], 5), "the worker outlived its controller"


def test_the_watchdog_stops_the_whole_group_when_its_controller_is_killed(
    tmp_path: Path,
) -> None:
    parent, (leader, grandchild, dog) = start_parent(tmp_path, "watchdog")
    assert is_alive(grandchild)
    parent.kill()  # no death signal here: only the watchdog can act
    parent.wait()
    # SIGTERM to the group, SIGKILL after the 1 s grace for the grandchild that ignores it
    assert gone_within([leader, grandchild], 10), "the group outlived its controller"
    assert gone_within([dog], 5), "the watchdog should exit once its groups are gone"


def test_a_group_is_only_signalled_when_its_start_time_matches() -> None:
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = proc_start_ticks(p.pid)
        assert start is not None and process_alive(p.pid, start, boot_id())
        assert not process_alive(p.pid, start + 1, boot_id())  # a reused pid is not it
        assert not process_alive(p.pid, start, "another-boot")
        assert stop_group(p.pid, start + 1, boot_id(), grace_s=0.5) == []
        assert p.poll() is None  # left alone
        assert stop_group(p.pid, start, boot_id(), grace_s=0.5) == [p.pid]
        assert p.wait(timeout=5) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_wrapper_execs_the_worker_with_default_signal_handling() -> None:
    """Python ignores SIGPIPE; a worker launched through the (Python) wrapper must not
    inherit that: the kernel's view of the exec'd program says nothing is ignored."""
    out = subprocess.run(
        guarded_argv(["cat", "/proc/self/status"]), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    ignored = int(
        next(ln for ln in out.stdout.splitlines() if ln.startswith("SigIgn:")).split()[1], 16
    )
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_a_starting_controller_reaps_what_a_dead_one_on_its_host_left(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        cfg, text = config(strategy={"name": "joint", "n_trials": 1})
        create_study(cfg, text, store)
        dead = subprocess.Popen(["true"])
        dead.wait()
        fleet = store.fleet()
        cid = fleet.register("t", host=host_name(), pid=dead.pid, proc_start=1, boot_id=boot_id())
        worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
        tmp = tmp_path / "at-tmp"
        tmp.mkdir()
        try:
            fleet.add_worker(
                cid,
                trial_name="trial-0007",
                host=host_name(),
                pgid=worker.pid,
                proc_start=proc_start_ticks(worker.pid),
                boot_id=boot_id(),
                tmpdir=str(tmp),
            )
            report = run_study("t", store, n_trials=0)
            assert worker.wait(timeout=15) == -signal.SIGTERM
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert f"controller {host_name()}:{dead.pid} of study 't' had died" in report.recovered
        assert (
            f"worker group {worker.pid} of trial-0007 ('t'): killed 1 process(es)"
            in report.recovered
        )
        assert not tmp.exists()
        (row,) = fleet.workers("t", states=None, controller_id=cid)
        assert row.state == "reaped"
        assert [c.state for c in fleet.controllers("t")] == ["failed", "stopped"]
