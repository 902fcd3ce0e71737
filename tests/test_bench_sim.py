"""The load generator against the simulated server over real HTTP: the client's timings
agree with the server's own per-request log, and `autotune bench` works end to end."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from autotune.config import WorkloadConfig
from autotune.loadgen.bench import format_result, parse_goodput, run_bench
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.frontend import DEFAULT_FRONT_END
from autotune.sim.routes import SimServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def sim_server(log: io.StringIO, time_scale: float, **args: Any) -> SimServer:
    m, hw = get_model(MODEL), get_hardware("H100-80GB")
    eng = Engine(m, hw, EngineArgs(max_model_len=4096, **args), keep_history=False)
    return SimServer(
        eng,
        served_model_name=MODEL,
        model_path=MODEL,
        time_scale=time_scale,
        request_log=log,
        stats_interval=0,
    )


async def test_client_timings_match_the_servers_request_log() -> None:
    log = io.StringIO()
    scale = 5.0
    srv = sim_server(log, scale)
    async with TestServer(srv.app()) as ts:
        wl = WorkloadConfig(
            source="random",
            num_prompts=60,
            input_len=256,
            output_len=32,
            arrival="poisson",
            rate=8.0,
            seed=1,
        )
        out = await run_bench(str(ts.make_url("")), wl)
    s = out.result.summary
    assert s["completed"] == 60 and s["failed"] == 0
    assert s["time_scale"] == scale
    truth = {r["request_id"]: r for r in map(json.loads, log.getvalue().splitlines())}
    recs = [r for r in out.result.records if not r.warmup]
    assert len(truth) == len(recs) == 60
    ttft_err, e2e_err = [], []
    for r in recs:
        t = truth[r.request_id]
        assert r.output_tokens == t["output_tokens"] == 32
        assert r.prompt_tokens == t["prompt_tokens"] == 256  # token-id prompts: exact
        ttft_err.append(r.ttft - (t["first_token"] - t["arrival"]))
        e2e_err.append(r.e2el - (t["finish"] - t["arrival"]))
    # the simulated API server tokenized each prompt before the engine saw it
    # (docs/simulator.md#34-the-api-server)
    fe = DEFAULT_FRONT_END
    admit = fe.per_request + 256 * fe.per_prompt_token
    assert min(t["scheduled"] - t["arrival"] for t in truth.values()) >= admit - 1e-9
    # Client-side times include HTTP and event-loop delays (in engine seconds: x scale);
    # they may never be shorter than the server's and should be close to them.
    ttft_err.sort()
    e2e_err.sort()
    assert ttft_err[0] > -0.002 * scale and e2e_err[0] > -0.002 * scale
    # medians: about 1 ms of wall time on an idle machine; 11.8 ms was seen in CI, with the
    # whole suite on 2 cores
    assert ttft_err[len(ttft_err) // 2] < 0.02 * scale
    assert e2e_err[len(e2e_err) // 2] < 0.02 * scale


async def test_bench_reports_vllm_keys_and_goodput(tmp_path: Path) -> None:
    srv = sim_server(io.StringIO(), 4.0, max_num_seqs=4)
    async with TestServer(srv.app()) as ts:
        wl = WorkloadConfig(
            source="synthetic", num_prompts=40, input_len=300, output_len=40, arrival="all-at-once"
        )
        out = await run_bench(str(ts.make_url("")), wl, goodput=parse_goodput(["ttft:1000"]))
    s = out.to_json()
    for key in (
        "completed",
        "failed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "p99_tpot_ms",
        "p99_itl_ms",
        "p99_e2el_ms",
        "request_goodput",
        "workload_fingerprint",
        "time_scale",
    ):
        assert key in s, key
    # max_num_seqs 4 with 40 requests at once: ten rounds of about 0.25 s each, so the first
    # few rounds meet a 1 s TTFT and the rest wait longer (a wide margin for a loaded CI)
    assert 0 < s["request_goodput"] < s["request_throughput"]
    text = format_result(out.result.summary)
    assert "Serving Benchmark Result" in text and "P99 TTFT (ms):" in text


def test_goodput_parsing_rejects_bad_items() -> None:
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    for bad in (["ttft"], ["foo:3"], ["tpot:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


async def test_cut_outputs_count_as_too_long_like_on_real_vllm() -> None:
    """vLLM serves a prompt below max_model_len with its output cut (200, finish_reason
    length): the client flags it, and scoring counts it with the over-length requests."""
    from autotune.loadgen.level import LevelMetrics
    from autotune.loadgen.load_options import LoadOptions
    from autotune.loadgen.runner import run_load
    from autotune.tuning.measure.scoring import Slo, score_level
    from autotune.workload.core import WorkloadRequest

    m, hw = get_model(MODEL), get_hardware("H100-80GB")
    eng = Engine(m, hw, EngineArgs(max_model_len=512), keep_history=False)
    srv = SimServer(
        eng, served_model_name=MODEL, model_path=MODEL, time_scale=10.0, stats_interval=0
    )
    reqs = [
        WorkloadRequest(500, 40, tuple(range(10, 510)), request_id="cut"),
        WorkloadRequest(100, 40, tuple(range(10, 110)), request_id="ok"),
        WorkloadRequest(600, 40, tuple(range(10, 610)), request_id="refused"),
    ]
    async with TestServer(srv.app()) as ts:
        res = await run_load(str(ts.make_url("")), reqs, LoadOptions(model=MODEL))
    by = {r.request_id: r for r in res.records}
    assert by["cut"].success and by["cut"].truncated and by["cut"].output_tokens == 12
    assert by["ok"].success and not by["ok"].truncated
    assert by["refused"].over_length and not by["refused"].success
    s = res.summary
    assert s["truncated_requests"] == 1 and s["over_length_rejections"] == 1
    lv = score_level(LevelMetrics.from_summary(s), Slo(p99_ttft_ms=10_000, max_overlength_rate=0.5))
    assert lv.violations["overlength_rate"] == pytest.approx(2 / 3 - 0.5)
