"""`autotune calibrate` end to end: a simulated server running on known constants (a twin
file) is probed over HTTP by the real command, and the profile it writes predicts that
server better than the base profile it started from (docs/calibrate.md#1-the-command)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_main import run_main
from support.processes import free_port
from test_calibrate_fit import MODEL, TRUTH
from test_sim_serve import start, stop, wait_healthy

from autotune.calibrate import Probe, live
from autotune.calibrate.live import run_suite
from autotune.calibrate.twin_fit import predict
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, TwinFile, dump_twin, load_twin, twin_hardware
from autotune.telemetry.scrape import parse_metrics

SERVER = EngineArgs(max_model_len=2048)  # _simulated_server's engine args
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
                # one run of the fit, not four: a third of the CPU; the starts' choice is
                # test_calibrate_fit.py's
                "--fit-starts",
                "1",
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
    assert set(twin.spec.residuals) == {"itl", "ttft", "ttft_last", "engine_itl", "engine_prefill"}
    # the fitted profile predicts the server's step as its client sees it; the base misses
    model, args = get_model(MODEL), EngineArgs(max_model_len=2048)
    fitted = predict(LOAD, model, twin.hardware, args)
    base = predict(LOAD, model, get_hardware("H100-80GB"), args)
    itl = {
        name: next(o.value for o in obs if o.metric == "itl")
        for name, obs in (("truth", held_out), ("fitted", fitted), ("base", base))
    }
    assert abs(itl["fitted"] / itl["truth"] - 1) < 0.1, (itl, held_out, done.stdout)
    assert abs(itl["fitted"] - itl["truth"]) < abs(itl["base"] - itl["truth"])


def test_a_bad_out_is_refused_before_any_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out that cannot be written, or a fit of no runs, is one line, before the server
    is asked anything (port 9 refuses: a probe would say "cannot reach server")."""
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
    code, out, err = run_main([*base, "--fit-starts", "0"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "error: autotune calibrate: Invalid value for '--fit-starts': Input should be greater "
        "than or equal to 1 (see `autotune calibrate --help`)"
    ]


@contextlib.contextmanager
def _simulated_server(twin: TwinFile | None = None) -> Iterator[int]:
    """A simulated H100 server (on ``twin``'s constants if given) on a free port, in real
    time, jitter off; yields the port. Faster, its steps would last a fraction of a
    millisecond of wall time, so a busy client would read them together and see the flushes
    these tests are about."""
    port = free_port()
    hardware = "H100-80GB"
    with tempfile.TemporaryDirectory() as folder:
        if twin is not None:
            path = Path(folder) / "twin.yaml"
            path.write_text(dump_twin(twin))
            hardware = f"file:{path}"
        args = ("--hardware", hardware, "--sim-startup-delay", "0", "--sim-jitter-cv", "0")
        proc = start(MODEL, *args, "--port", str(port), "--max-model-len", "2048")
        try:
            wait_healthy(port, proc)
            yield port
        finally:
            stop(proc)


def _prefix_hits(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )


def test_a_server_probed_twice_never_sees_a_prompt_again() -> None:
    """The prompts derive from the request ids; each run of the suite tags them afresh, so
    a second calibration of one server cannot hit its prefix cache and fake fast prefills
    (docs/calibrate.md#2-the-probe-suite)."""
    probes = [Probe("prefill", 1024, 1, requests=3)]
    with _simulated_server() as port:
        for _ in range(2):
            run = asyncio.run(run_suite(f"http://127.0.0.1:{port}", probes))
            assert run.runs[0].completed == 3
        hits = _prefix_hits(port)
    assert hits == 0


def test_a_probe_whose_streams_all_came_in_a_flush_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A starved API server writes whole streams at once; such a run times the starvation,
    so the probe runs again with prompts of its own and its figures come from the streamed
    run (docs/calibrate.md#2-the-probe-suite)."""
    real = live.run_load
    sent: list[list[str]] = []

    async def first_run_flushed(url: str, requests: Any, options: Any) -> Any:
        res = await real(url, requests, options)
        sent.append([r.request_id for r in requests])
        if len(sent) == 2:  # the warm-up, then the probe's first run: every gap gone
            for r in res.records:
                r.itl = [0.0] * len(r.itl)
        return res

    monkeypatch.setattr(live, "run_load", first_run_flushed)
    with _simulated_server() as port:
        run = asyncio.run(
            run_suite(f"http://127.0.0.1:{port}", [Probe("decode", 16, 32, requests=3)])
        ).runs[0]
    assert (run.attempts, run.completed, run.flushed) == (2, 6, 3)
    assert not set(sent[1]) & set(sent[2])  # new prompts
    itl = next(o.value for o in run.observations if o.metric == "itl")
    assert itl > 1e-3  # the streamed run's gaps, not the flush's zeros
    # the server's own histograms counted both runs' steps: a flush is the API server's
    engine = next(o.value for o in run.observations if o.metric == "engine_itl")
    assert engine == pytest.approx(itl, rel=0.2)


def test_the_servers_own_step_times_pass_its_api_server_by_and_the_twin_predicts_both() -> None:
    """The engine core's figures come from the server's /metrics histograms, stamped when a
    step ends; the client's from its stream, delivered by the API server. On a server
    whose API server streams slower than its engine steps, the client's gaps are the API
    server's and the histograms' the engine's, and the twin replaying the probe on the
    same constants predicts each (docs/calibrate.md#2-the-probe-suite)."""
    slow = TRUTH.model_copy(update={"front_end": {**TRUTH.front_end, "per_output_token": 2e-3}})
    probes = [
        Probe("concurrency", 64, 24, requests=16, concurrency=8),
        Probe("prefill", 512, 1, requests=3),
    ]
    with _simulated_server(slow) as port:
        run = asyncio.run(run_suite(f"http://127.0.0.1:{port}", probes))
    got = {o.key: o.value for o in run.observations}
    model = get_model(MODEL)
    want = {o.key: o.value for o in predict(probes, model, twin_hardware(slow, "slow"), SERVER)}
    name = probes[0].name
    # 8 tokens a step at 2 ms each: 16 ms of streaming behind a much shorter step
    assert got[(name, "engine_itl")] < 0.75 * got[(name, "itl")]
    for key in [(name, "itl"), (name, "engine_itl"), (probes[1].name, "engine_prefill")]:
        assert got[key] == pytest.approx(want[key], rel=0.1), key


def test_engine_delta_reads_the_two_histograms_between_two_pages() -> None:
    page = (
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_bucket{{le="+Inf"}} {n}\n'
        "vllm:inter_token_latency_seconds_count {n}\n"
        "vllm:inter_token_latency_seconds_sum {s}\n"
        "# TYPE vllm:request_prefill_time_seconds histogram\n"
        'vllm:request_prefill_time_seconds_bucket{{le="+Inf"}} {m}\n'
        "vllm:request_prefill_time_seconds_count {m}\n"
        "vllm:request_prefill_time_seconds_sum {p}\n"
    )
    before = parse_metrics(page.format(n=10, s=0.05, m=2, p=0.02))
    after = parse_metrics(page.format(n=40, s=0.2, m=5, p=0.08))
    delta = live.engine_delta(before, after)
    assert delta is not None
    assert (delta.itl_count, delta.prefill_count) == (30, 3)
    assert (delta.itl_sum, delta.prefill_sum) == pytest.approx((0.15, 0.06))
    # a page that could not be read, or a server without the histograms: no engine figures
    assert live.engine_delta(None, after) is None
    other = parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    assert live.engine_delta(other, other) is None
