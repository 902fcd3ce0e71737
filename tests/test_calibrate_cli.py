"""`autotune calibrate` end to end: a simulated server running on known constants (a twin
file) is probed over HTTP by the real command, and the profile it writes predicts that
server better than the base profile it started from (docs/calibrate.md#1-the-command)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_main import run_main
from support.processes import free_port
from test_calibrate_fit import MODEL, TRUTH
from test_sim_serve import start, stop, wait_healthy

from autotune.calibrate import Probe
from autotune.calibrate.live import run_suite
from autotune.calibrate.twin_fit import predict
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, dump_twin, load_twin

LOAD = [Probe("concurrency", 700, 64, requests=48, concurrency=24)]


def test_calibrate_probes_a_live_server_and_writes_a_profile_that_predicts_it(
    tmp_path: Path,
) -> None:
    truth_file = tmp_path / "truth.yaml"
    truth_file.write_text(dump_twin(TRUTH))
    port = free_port()
    proc = start(
        MODEL,
        "--hardware",
        f"file:{truth_file}",
        "--port",
        str(port),
        "--sim-startup-delay",
        "0",
        "--max-model-len",
        "2048",
        "--time-scale",
        "2",
    )
    out = tmp_path / "fitted.yaml"
    try:
        wait_healthy(port, proc)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "autotune.cli",
                "calibrate",
                "--base-url",
                f"http://127.0.0.1:{port}",
                "--model",
                MODEL,
                "--out",
                str(out),
                "--max-model-len",
                "2048",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # a load no probe sent, measured over HTTP as the probes were
        held_out = asyncio.run(run_suite(f"http://127.0.0.1:{port}", LOAD)).observations
    finally:
        stop(proc)
    assert done.returncode == 0, done.stderr
    assert "probe decode-p16-o64-c1: 5 ok, 0 failed" in done.stdout
    assert f"wrote {out}" in done.stdout
    twin = load_twin(f"file:{out}")
    assert twin.spec.base == "H100-80GB"
    assert twin.spec.measured.vllm == "0.32.0" and twin.spec.measured.model == MODEL
    assert twin.spec.measured.host and twin.spec.measured.when
    assert set(twin.spec.residuals) == {"itl", "ttft", "ttft_last"}
    # the fitted profile predicts the server's step as its client sees it; the base misses
    model, args = get_model(MODEL), EngineArgs(max_model_len=2048)
    fitted = predict(LOAD, model, twin.hardware, args)
    base = predict(LOAD, model, get_hardware("H100-80GB"), args)
    itl = {
        name: next(o.value for o in obs if o.metric == "itl")
        for name, obs in (("truth", held_out), ("fitted", fitted), ("base", base))
    }
    assert abs(itl["fitted"] / itl["truth"] - 1) < 0.1
    assert abs(itl["fitted"] - itl["truth"]) < abs(itl["base"] - itl["truth"])


def test_a_bad_out_is_refused_before_any_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out that cannot be written is one line, before the server is asked anything
    (port 9 refuses: a probe would say "cannot reach server")."""
    base = ["calibrate", "--base-url", "http://127.0.0.1:9", "--model", MODEL]
    code, out, err = run_main([*base, "--out", str(tmp_path)], capsys)
    assert code == 1 and err.strip().splitlines() == [
        f"error: --out: {tmp_path} is a folder; give the profile file's path"
    ]
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = run_main([*base, "--out", str(blocker / "twin.yaml")], capsys)
    assert code == 1 and err.startswith(f"error: --out: cannot write {blocker / 'twin.yaml'} (")
    assert "reach server" not in err and out == ""
