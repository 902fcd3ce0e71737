"""`autotune sim serve` through the real CLI process: startup, flags, failures, shutdown."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.processes import free_port

from autotune.failures import FailureClass, classify_log

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", "sim", "serve", *args]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        serve_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_healthy(port: int, proc: subprocess.Popen[str], deadline_s: float = 15.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read()}")  # type: ignore[union-attr]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server did not become healthy")


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    return proc.returncode, out, err


def test_serves_healthy_within_seconds_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "req.jsonl"
    proc = start(
        MODEL,
        "--hardware",
        "H100-80GB",
        "--port",
        str(port),
        "--sim-startup-delay",
        "0",
        "--max-model-len",
        "4096",
        "--time-scale",
        "10",
        "--dtype",
        "bfloat16",
        "--trust-remote-code",
        "--sim-request-log",
        str(log),
    )
    try:
        assert wait_healthy(port, proc) < 10
        body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 3}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 3
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["max_model_len"] == 4096
    finally:
        rc, out, _err = stop(proc)
    assert rc == 0
    assert "GPU KV cache size:" in out and "Maximum concurrency for 4,096 tokens" in out
    assert "ignored by the simulator: --dtype, --trust-remote-code" in out
    assert json.loads(log.read_text().splitlines()[0])["output_tokens"] == 3


@pytest.mark.parametrize(
    ("flags", "cls", "needle"),
    [
        (["--max-num-seqs", "0"], FailureClass.CONFIG_INVALID, "greater than or equal to 1"),
        (
            ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            FailureClass.MNBT_LT_MNS,
            "must be greater than or equal to max_num_seqs (512)",
        ),
        (
            [
                "--max-model-len",
                "8192",
                "--max-num-batched-tokens",
                "4096",
                "--no-enable-chunked-prefill",
            ],
            FailureClass.MNBT_LT_MAXLEN,
            "is smaller than max_model_len (8192)",
        ),
        (
            ["--max-model-len", "200000"],
            FailureClass.MAXLEN_GT_MODEL,
            "is greater than the derived max_model_len",
        ),
        (
            ["--gpu-memory-utilization", "0.3"],
            FailureClass.KV_TOO_SMALL,
            "estimated maximum model length is",
        ),
        (
            ["--gpu-memory-utilization", "0.19"],
            FailureClass.NO_KV_MEMORY,
            "No available memory for the cache blocks",
        ),
        (
            ["--sim-other-tenant-gib", "20"],
            FailureClass.FREE_MEMORY,
            "on startup is less than desired GPU memory utilization",
        ),
    ],
)
def test_startup_failures_exit_1_with_vllms_text(
    flags: list[str], cls: FailureClass, needle: str
) -> None:
    port = free_port()
    proc = subprocess.run(
        serve_cmd(
            MODEL,
            "--hardware",
            "H100-80GB",
            "--port",
            str(port),
            "--sim-startup-delay",
            "0",
            *flags,
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert needle in proc.stderr
    match = classify_log((proc.stdout + proc.stderr).splitlines())
    assert match is not None and match.failure_class is cls
    if cls is FailureClass.KV_TOO_SMALL:
        assert match.estimated_max_model_len is not None and match.estimated_max_model_len > 0


def test_unknown_flag_is_an_argparse_error() -> None:
    proc = subprocess.run(
        serve_cmd(MODEL, "--hardware", "H100-80GB", "--max-num-seqz", "3"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --max-num-seqz" in proc.stderr


def test_port_in_use_is_classified() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            serve_cmd(
                MODEL, "--hardware", "H100-80GB", "--port", str(port), "--sim-startup-delay", "0"
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 1
    match = classify_log(proc.stderr.splitlines())
    assert match is not None and match.failure_class is FailureClass.PORT_IN_USE


def test_startup_delay_holds_back_health() -> None:
    port = free_port()
    proc = start(
        MODEL,
        "--hardware",
        "H100-80GB",
        "--port",
        str(port),
        "--sim-startup-delay",
        "1.5",
        "--max-model-len",
        "4096",
    )
    try:
        took = wait_healthy(port, proc)
    finally:
        stop(proc)
    assert took >= 1.4
