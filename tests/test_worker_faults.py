"""Whose doing a worker's death is, and a hung worker told from a busy one
(docs/vllm.md#10-whose-death-is-it). The end-to-end retry of a killed or frozen worker, with
real controllers, is in tests/test_faults.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import free_port

from autotune.failures import FailureClass, FailureMatch
from autotune.tuning.run.events import Event, LevelProgress, WorkerDied
from autotune.workers.cause import death_class
from autotune.workers.stall import StallWatch, proc_state
from autotune.workers.supervisor import WorkerLaunchError
from autotune.workers.vllm import VllmWorker
from autotune.workers.watch import DeathWatch, snapshot_group

OOM = FailureMatch(FailureClass.RUNTIME_OOM, "torch.OutOfMemoryError: CUDA out of memory")
DEAD = FailureMatch(FailureClass.ENGINE_DEAD, "EngineDeadError: EngineCore encountered an issue")
KV = FailureMatch(FailureClass.KV_TOO_SMALL, "To serve at least one request ... KV cache is needed")


@pytest.mark.parametrize(
    ("signal_name", "hung", "log", "started", "expected"),
    [
        # a kill from outside: the EngineDeadError that follows is its consequence
        ("SIGKILL", False, DEAD, True, FailureClass.KILLED),
        ("SIGTERM", False, None, True, FailureClass.KILLED),
        # an OOM in the log is the configuration's, even when the OOM killer sent SIGKILL
        ("SIGKILL", False, OOM, True, FailureClass.RUNTIME_OOM),
        # a crash of its own (the CPU backend's SIGILL) or an exit of its own
        ("SIGILL", False, None, True, FailureClass.ENGINE_DEAD),
        (None, False, DEAD, True, FailureClass.ENGINE_DEAD),
        (None, True, None, True, FailureClass.HUNG),
        # start-up: the log's class stands; a bare kill is KILLED, a bare exit UNKNOWN
        ("SIGKILL", False, None, False, FailureClass.KILLED),
        (None, False, KV, False, FailureClass.KV_TOO_SMALL),
        (None, False, None, False, FailureClass.UNKNOWN),
    ],
)
def test_death_class(
    signal_name: str | None,
    hung: bool,
    log: FailureMatch | None,
    started: bool,
    expected: FailureClass,
) -> None:
    assert death_class(signal=signal_name, hung=hung, log=log, started=started) is expected


# -- hung or busy ------------------------------------------------------------------------------


def spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def cleanup(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def watch_for(stall: StallWatch, seconds: float, health: bool = False) -> float | None:
    """Sample every 0.1 s for ``seconds``; when it flags a hang, seconds until then."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if health:
            stall.note_health()
        if stall.sample() is not None:
            return time.perf_counter() - t0
        time.sleep(0.1)
    return None


def test_a_busy_process_is_never_hung_without_health_answers_or_completions() -> None:
    """A process that burns CPU is working, however late its probes answer: never flagged,
    though nothing completes and /health never answers (the 50-stream burst on 2 cores)."""
    proc = spawn("while True: pass")
    try:
        stall = StallWatch({proc.pid: "busy"}, stall_s=1.0)
        assert watch_for(stall, 3.0) is None
        # the same process stopped: found once the stall time has passed
        os.kill(proc.pid, signal.SIGSTOP)
        after = watch_for(stall, 5.0)
        assert after is not None and 1.0 <= after < 2.0, after
        hung = stall.sample()
        assert hung is not None and hung.pid == proc.pid
        assert "stopped (state T)" in hung.message and "no CPU time" in hung.message
    finally:
        cleanup(proc)


def test_a_completed_request_keeps_a_frozen_group_from_counting_as_hung() -> None:
    proc = spawn("import time; time.sleep(60)")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        stall = StallWatch({proc.pid: "server"}, stall_s=1.0)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0:
            stall.note_progress()  # requests complete: someone serves them
            assert stall.sample() is None
            time.sleep(0.1)
    finally:
        cleanup(proc)


def test_an_idle_process_is_hung_only_when_health_stops_answering() -> None:
    """A sleeping server uses no CPU time: a /health 200 says it is idle, not hung; with
    neither CPU time, completions nor answers it is silent (a deadlock)."""
    proc = spawn("import time; time.sleep(60)")
    try:
        assert watch_for(StallWatch({proc.pid: "idle"}, stall_s=1.0), 2.5, health=True) is None
        stall = StallWatch({proc.pid: "idle"}, stall_s=1.0)
        assert watch_for(stall, 3.0) is not None
        hung = stall.sample()
        assert hung is not None and "no /health answer" in hung.message
    finally:
        cleanup(proc)


async def test_the_death_watch_finds_a_stopped_leader_and_ignores_probe_timeouts(
    tmp_path: Path,
) -> None:
    proc = spawn("import time; time.sleep(60)")
    try:
        await asyncio.sleep(0.2)
        watch = DeathWatch(
            proc,
            snapshot_group(proc.pid),
            health_url=f"http://127.0.0.1:{free_port()}/health",
            log_path=tmp_path / "log",
            health_every_s=3600.0,
            stall_s=1.0,
        )
        for _ in range(5):
            watch._health_result(None)  # timed out: no failure either way
        assert watch.death is None and watch._fails == []
        task = asyncio.create_task(watch.run())
        watch.stall.note_health()
        os.kill(proc.pid, signal.SIGSTOP)
        await asyncio.wait_for(watch.event.wait(), 10)
        await task
        d = watch.death
        assert d is not None and d.cause == "hung" and d.pid == proc.pid and d.signal is None
        assert d.detected_wall <= time.time()
    finally:
        cleanup(proc)


# -- a death during the smoke request is classed by its cause ---------------------------------

# A stand-in server: /health 200, then on the smoke request it prints the given log line and
# sends itself the given signal.
_SERVER = r"""
import http.server, os, signal, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
line, sig = os.environ["FAKE_LINE"], getattr(signal, os.environ["FAKE_SIGNAL"])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/completions":
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
            return
        if line: print(line, flush=True)
        os.kill(os.getpid(), sig)
print("INFO: Application startup complete.", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize(
    ("sig", "line", "expected"),
    [
        ("SIGKILL", "", FailureClass.KILLED),
        ("SIGKILL", "torch.OutOfMemoryError: CUDA out of memory", FailureClass.RUNTIME_OOM),
        ("SIGSEGV", "", FailureClass.ENGINE_DEAD),
        ("SIGSTOP", "", FailureClass.HUNG),
    ],
)
async def test_a_death_during_the_smoke_request_is_classed_by_its_cause(
    tmp_path: Path, sig: str, line: str, expected: FailureClass
) -> None:
    script = tmp_path / "fake.py"
    script.write_text(_SERVER)
    worker = VllmWorker(
        executable=(sys.executable, str(script)),
        model="m",
        served_model_name=None,
        static_args={},
        env={"FAKE_LINE": line, "FAKE_SIGNAL": sig},
        gpus=None,
        startup_timeout_s=30,
        workdir=tmp_path / "w",
    )
    worker.smoke_timeout_s = 2.0  # a stopped server never answers
    worker.grace_s = 3.0
    with pytest.raises(WorkerLaunchError) as err:
        await worker.start({}, "t")
    assert err.value.failure_class is expected, str(err.value)
    assert not worker.alive()
    if sig == "SIGKILL" and not line:
        assert "killed by SIGKILL" in str(err.value)


def test_proc_state_reads_state_and_cpu_ticks() -> None:
    got = proc_state(os.getpid())
    assert got is not None and got[0] in "RS" and got[1] >= 0
    assert proc_state(2**22 + 12345) is None


def test_the_progress_line_says_hung_not_died(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli.progress import progress_printer

    progress_printer()(WorkerDied(0, 1.0, "HUNG", "API server hung"))
    out = capsys.readouterr().out
    assert "worker hung (HUNG): API server hung" in out and "died" not in out


# -- the controller retries a killed worker once (without PostgreSQL) -------------------------


def test_a_study_retries_a_trial_whose_worker_was_killed_and_takes_the_retrys_verdict(
    tmp_path: Path,
) -> None:
    """The baseline's sim worker is killed mid-level: the attempt is stored FAIL (KILLED)
    with its partial level, the configuration runs again once in a fresh worker, and the
    study's result is the retry's clean run (docs/faults.md#10-worker-faults)."""
    import optuna
    from support.processes import children_serving
    from support.studies import config

    from autotune.store import Store
    from autotune.tuning.run.controller import run_study
    from autotune.tuning.run.create import create_study

    cfg, text = config(
        mode="fixed-rate",
        worker={"kind": "sim", "time_scale": 1.0, "workdir": str(tmp_path / "w")},
        workload={"num_prompts": 16, "rate": 8, "input_len": 256, "output_len": 16},
        slo={"p99_ttft_ms": 30000, "p99_tpot_ms": 500},
        # the 16-request sample as it is: looped to the default 30 engine s
        # (docs/tuning.md#13-level-length) each attempt's level would last 30 wall s
        strategy={
            "name": "joint",
            "n_trials": 1,
            "validate": {"enabled": False},
            "min_level_s": 0,
            "min_level_requests": 0,
        },
    )
    killed: list[int] = []

    def on_event(e: Event) -> None:
        if isinstance(e, LevelProgress) and e.completed >= 2 and not killed:
            (pid,) = children_serving()
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)

    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        report = run_study(cfg.name, store, on_event=on_event)
        first, retry = store.trials(cfg.name)
        study = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
        states = [(t.state.name, t.system_attrs.get("retry_history")) for t in study.trials]
    assert killed and report.stopped_by == "plan complete" and report.trials_run == 1
    assert states == [("FAIL", None), ("COMPLETE", [0])]
    assert (first.state, first.failure_class) == ("FAIL", "KILLED")
    assert (first.log_tail or "").startswith("attempt failed (KILLED)")
    (lvl,) = first.levels
    assert lvl.metrics["partial"] is True and lvl.metrics["worker_death"]["signal"] == "SIGKILL"
    assert (retry.state, retry.failure_class, retry.feasible) == ("COMPLETE", None, True)
    assert retry.engine_args == first.engine_args and retry.launch_argv != first.launch_argv
