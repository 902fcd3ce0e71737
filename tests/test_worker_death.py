"""A worker that dies mid-level (docs/vllm.md#9-worker-death): the watch notices each kind of
death, the load generator stops sending at once, and a trial keeps the partial level with the
cause and the signal. The simulated server is one process: killing it is the API server's
death; its fault hook (SIGUSR1) stands for an EngineCore death (``EngineDeadError`` in the log,
``/health`` 503, the process still up). No wall-clock bound is asserted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from support.processes import children_serving, free_port

from autotune.loadgen import LoadOptions, run_load
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer
from autotune.store import Store
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.trial import TrialSetup, run_trial
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import Event, LevelProgress, WorkerDied
from autotune.tuning.search.plan import baseline_engine_args
from autotune.workers.watch import DeathWatch, snapshot_group
from autotune.workload.build import build_workload
from autotune.workload.core import Workload, WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# -- the watch ----------------------------------------------------------------------------


def group(cmd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", cmd], start_new_session=True)


async def watched(proc: subprocess.Popen[bytes], log: Path, **kw: Any) -> DeathWatch:
    # the shell starts its background child, which execs `sleep`: a member snapshotted
    # between fork and exec would be named `sh`, and its death message would say so
    for _ in range(250):
        members = [pid for pid in snapshot_group(proc.pid) if pid != proc.pid]
        if members and all(_name(pid) == "sleep" for pid in members):
            break
        await asyncio.sleep(0.02)
    members = snapshot_group(proc.pid)
    kw.setdefault("health_every_s", 3600.0)
    return DeathWatch(
        proc, members, health_url=f"http://127.0.0.1:{free_port()}/health", log_path=log, **kw
    )


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def until_dead(watch: DeathWatch) -> float:
    task = asyncio.create_task(watch.run())
    await asyncio.wait_for(watch.event.wait(), 20)
    await task
    assert watch.death is not None
    return watch.death.detected_at


def cleanup(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


async def test_a_member_killed_is_a_death_with_its_signal(tmp_path: Path) -> None:
    # the leader never reaps its background child: the zombie shows the exit status
    proc = group("sleep 60 & exec sleep 61")
    try:
        watch = await watched(proc, tmp_path / "log")
        child = next(pid for pid in snapshot_group(proc.pid) if pid != proc.pid)
        os.kill(child, signal.SIGKILL)
        await until_dead(watch)
        d = watch.death
        assert d is not None and d.cause == "process_exit" and d.pid == child
        assert d.signal == "SIGKILL" and d.returncode == -9 and "sleep" in d.message
    finally:
        cleanup(proc)


async def test_the_leader_exiting_is_a_death_with_its_exit_code(tmp_path: Path) -> None:
    # the leader waits in a builtin and exits on a signal: a foreground `sleep` would be a
    # member whose own exit, seen first on a loaded machine, reads as the death
    proc = group("trap 'exit 3' USR1; sleep 60 & wait")
    try:
        watch = await watched(proc, tmp_path / "log")
        os.kill(proc.pid, signal.SIGUSR1)
        await until_dead(watch)
        d = watch.death
        assert d is not None and d.cause == "leader_exit" and d.returncode == 3
        assert d.signal is None and "exited with code 3" in d.message
    finally:
        cleanup(proc)


async def test_engine_dead_error_in_the_log_is_a_death(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("INFO starting\n")
    proc = group("sleep 60 & exec sleep 61")
    try:
        watch = await watched(proc, log)
        task = asyncio.create_task(watch.run())
        await asyncio.sleep(0.3)
        assert watch.death is None  # alive and quiet: no false alarm
        with log.open("a") as f:
            f.write("ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered\n")
        await asyncio.wait_for(watch.event.wait(), 20)
        await task
        assert watch.death is not None and watch.death.cause == "engine_dead_log"
        assert "EngineDeadError" in watch.death.message
    finally:
        cleanup(proc)


async def test_health_must_fail_three_times_over_the_span(tmp_path: Path) -> None:
    proc = group("sleep 60 & exec sleep 61")
    try:
        # probes every 0.1 s against a closed port; the span rule (0.5 s here) still holds
        watch = await watched(proc, tmp_path / "log", health_every_s=0.1, health_span_s=0.5)
        t0 = time.perf_counter()
        detected = await until_dead(watch)
        d = watch.death
        assert d is not None and d.cause == "health"
        # 3 failures come within 0.2 s: it takes more of them to cover the 0.5 s span
        m = re.match(r"/health failed (\d+) times in a row over ([\d.]+) s", d.message)
        assert m is not None and int(m.group(1)) > 3 and float(m.group(2)) >= 0.5
        assert detected - t0 >= 0.5
        watch2 = await watched(proc, tmp_path / "log", health_every_s=0.1)
        for ok in (False, False, True, False, False):  # a success resets the count
            watch2._health_result(ok)
        assert watch2.death is None
    finally:
        cleanup(proc)


# -- the load generator stops at once -------------------------------------------------------


async def test_run_load_stops_sending_when_the_stop_event_is_set() -> None:
    eng = Engine(get_model(MODEL), get_hardware("H100-80GB"), EngineArgs(max_model_len=2048))
    srv = SimServer(eng, served_model_name=MODEL, model_path=MODEL, time_scale=1.0)
    reqs = [
        WorkloadRequest(
            128, 4, prompt_token_ids=tuple([100] * 128), arrival=0.05 * i, request_id=f"r{i}"
        )
        for i in range(200)
    ]
    stop = asyncio.Event()
    set_at: list[float] = []

    def progress(p: Any) -> None:
        if p.completed >= 5 and not stop.is_set():
            stop.set()
            set_at.append(time.perf_counter())

    async with TestServer(srv.app()) as ts:
        res = await run_load(
            str(ts.make_url("")),
            reqs,
            LoadOptions(model=MODEL, progress_interval=0.0),
            progress=progress,
            stop=stop,
        )
    assert res.stopped_at is not None and set_at
    detected = (set_at[0] - res.origin) * res.time_scale
    sent = [r for r in res.records if r.sent_at is not None]
    assert 5 <= len(sent) < 200 and all(r.sent_at <= detected for r in sent)
    assert res.summary["completed"] >= 5  # kept
    assert max(r.finished_at for r in res.records) < reqs[-1].arrival  # before the schedule


# -- a trial on the sim worker: the partial level and the signal are stored -----------------


def _study(tmp_path: Path, store: Store) -> Any:
    from support.studies import config

    cfg, text = config(
        mode="fixed-rate",
        worker={"kind": "sim", "time_scale": 1.0, "workdir": str(tmp_path / "w")},
        workload={"num_prompts": 80, "rate": 4, "input_len": 256, "output_len": 16},
        strategy={"name": "joint", "n_trials": 1},
    )
    create_study(cfg, text, store)
    return cfg


@pytest.mark.parametrize(
    ("sig", "cause", "signal_name", "failure_class"),
    [
        # the server process dies from outside: no verdict on the config (KILLED)
        (signal.SIGKILL, "leader_exit", "SIGKILL", "KILLED"),
        # the fault hook: its engine dies, the log says so (the config's: ENGINE_DEAD)
        (signal.SIGUSR1, "engine_dead_log", None, "ENGINE_DEAD"),
    ],
    ids=["server-killed", "engine-dead"],
)
async def test_a_trial_keeps_the_partial_level_and_the_cause(
    tmp_path: Path, sig: signal.Signals, cause: str, signal_name: str | None, failure_class: str
) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        cfg = _study(tmp_path, store)
        model = get_model(cfg.model.name)
        wl: Workload = build_workload(cfg.workload, vocab_size=model.vocab_size)
        runner = make_runner(cfg, model, get_hardware(cfg.hardware), tmp_path / "w")
        assert isinstance(runner, HttpRunner)
        killed: list[float] = []
        events: list[Event] = []

        def on_event(e: Event) -> None:
            events.append(e)
            if isinstance(e, LevelProgress) and e.completed >= 4 and not killed:
                (pid,) = children_serving()
                killed.append(time.perf_counter())
                os.kill(pid, sig)

        setup = TrialSetup(cfg, runner, wl, store, cfg.name, on_event)
        engine_args = baseline_engine_args(model, get_hardware(cfg.hardware), 2048)
        out = await run_trial(setup, number=0, stage="baseline", params={}, engine_args=engine_args)
        assert killed, "the level never got going"
        death = runner.worker.death()
        assert death is not None and death.cause == cause
        print(f"\ndetection after {sig.name}: {death.detected_at - killed[0]:.3f} s")
        assert out.failure_class == failure_class and out.retry is None  # not told to retry
        (trial,) = store.trials(cfg.name)
        assert trial.failure_class == failure_class and trial.feasible is False
        (lvl,) = trial.levels
        assert lvl.metrics["partial"] is True and lvl.feasible is False
        assert 4 <= lvl.completed < 80 and lvl.metrics["sent_requests"] < 80
        stored = lvl.metrics["worker_death"]
        assert stored["cause"] == cause and stored["signal"] == signal_name
        # nothing was sent after the death was detected (times: engine s of the level)
        assert lvl.metrics["last_sent_at_s"] <= stored["detected_at_s"]
        # the level ended before its schedule (80 requests at 4/s: 20 s of arrivals)
        assert stored["stopped_at_s"] < max(wl.arrivals())
        tail = trial.log_tail or ""
        assert tail.startswith("worker died: ")
        if signal_name is not None:
            assert stored["returncode"] == -sig.value
            # what was seen, not the log's last (access) line: a SIGKILL leaves no log line
            assert tail.splitlines()[0] == f"worker died: {death.message}"
            assert f"killed by {signal_name}" in death.message and stored["log_line"] == ""
        else:
            assert "EngineDeadError" in tail and stored["log_line"]
        died = [e for e in events if isinstance(e, WorkerDied)]
        assert len(died) == 1 and died[0].message.split(";")[0] == death.message


def test_progress_line_names_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """The study's progress output prints the death's reason on its own line."""
    from autotune.cli.progress import progress_printer

    on_event = progress_printer()
    on_event(WorkerDied(0, 1.0, "ENGINE_DEAD", "API server (pid 7) killed by SIGKILL"))
    out = capsys.readouterr().out
    assert "worker died (ENGINE_DEAD): API server (pid 7) killed by SIGKILL" in out
