"""Each bottleneck class reproduced end to end on the simulated engine by engine args that
cause it, from the engine's timeline (``sim-virtual``) and through the simulated HTTP server's
``/metrics`` scraped before, during and after a real load run."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autotune.loadgen import LoadOptions, run_load
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import from_sim_timeline
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.lengths import lognormal_requests
from autotune.sim.request import SimRequest
from autotune.sim.routes import SimServer
from autotune.sim.virtual_loop import simulate
from autotune.telemetry import Scraper, diagnose, from_scrape
from autotune.telemetry.scrape import ScrapeStats, scrape
from autotune.workload.core import WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HW = "H100-80GB"

# engine args, workload -> the class they cause
SCENARIOS: dict[str, tuple[EngineArgs, list[SimRequest]]] = {
    # 4 sequences at a time against 20 requests/s of short requests
    "concurrency-capped": (
        EngineArgs(max_model_len=4096, max_num_seqs=4),
        lognormal_requests(100, 200, 100, seed=1, rate=20),
    ),
    # 256 tokens per step against ~3 000-token prompts
    "token-budget-bound": (
        EngineArgs(max_model_len=8192, max_num_seqs=128, max_num_batched_tokens=256),
        lognormal_requests(60, 3000, 50, seed=1, rate=20, max_prompt=6000),
    ),
    # 512 MiB of KV (4 096 tokens) against 60 requests growing to ~1 200 outputs each
    "memory-bound": (
        EngineArgs(max_model_len=2048, kv_cache_memory_bytes=512 * 2**20),
        lognormal_requests(60, 100, 1200, seed=1, max_prompt=140, max_output=1900),
    ),
    # vLLM's defaults at 2 requests/s
    "headroom": (EngineArgs(max_model_len=4096), lognormal_requests(100, 300, 100, seed=1, rate=2)),
}


@pytest.mark.parametrize("expected", list(SCENARIOS))
def test_class_reproduced_on_sim_timeline(expected: str) -> None:
    args, reqs = SCENARIOS[expected]
    result = simulate(get_model(MODEL), get_hardware(HW), args, reqs, seed=0)
    a = result.args
    end = result.end  # the last token's delivery, after the engine's last step
    tel = from_sim_timeline(result, 0.0, end, a.max_num_batched_tokens, a.max_num_seqs)
    d = diagnose(tel, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens)
    assert d.kind == expected, d
    assert tel.source == "sim-timeline" and tel.finished == len(reqs)
    assert tel.counters["preemptions"] == result.num_preemptions
    assert tel.counters["generation_tokens"] == sum(r.output_len for r in result.requests)
    if expected != "memory-bound":
        # The deltas alone (every mid-level sample lost) reach the same verdict.
        bare = replace(tel, gauges={}, saturated_fraction=None, samples=0)
        assert (
            diagnose(
                bare, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens
            ).kind
            == expected
        )


def test_sim_timeline_window_slices_a_level() -> None:
    args, reqs = SCENARIOS["concurrency-capped"]
    result = simulate(get_model(MODEL), get_hardware(HW), args, reqs, seed=0)
    mid = result.end / 2
    first = from_sim_timeline(result, 0.0, mid, 8192, 4)
    second = from_sim_timeline(result, mid, result.end, 8192, 4)
    assert first.finished + second.finished == len(reqs)
    for key in ("prompt_tokens", "generation_tokens"):
        whole = from_sim_timeline(result, 0.0, result.end, 8192, 4)
        assert first.counters[key] + second.counters[key] == whole.counters[key]
    assert "prefix_cache_queries" not in first.counters  # only run totals exist
    steps = first.histograms["iteration_tokens"].count + second.histograms["iteration_tokens"].count
    assert steps == result.num_steps


# -- through the simulated HTTP server -------------------------------------------------------


@pytest.fixture
async def budget_server() -> AsyncIterator[tuple[str, SimServer]]:
    args = EngineArgs(max_model_len=8192, max_num_seqs=128, max_num_batched_tokens=256)
    eng = Engine(get_model(MODEL), get_hardware(HW), args, seed=0, keep_history=False)
    sim = SimServer(
        eng, served_model_name=MODEL, model_path=MODEL, time_scale=10.0, stats_interval=0
    )
    async with TestServer(sim.app(), host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), sim


def long_prompts(n: int, seed: int = 0) -> list[WorkloadRequest]:
    rng = random.Random(seed)  # distinct prompts: no prefix-cache hits shorten prefill
    return [
        WorkloadRequest(
            prompt_len=(p := rng.randint(2500, 3500)),
            output_len=10,
            prompt_token_ids=tuple(rng.randrange(1, 100_000) for _ in range(p)),
            request_id=f"r{i}",
        )
        for i in range(n)
    ]


async def test_token_budget_bound_through_http_server(budget_server: tuple[str, SimServer]) -> None:
    url, _ = budget_server
    async with Scraper(url + "/metrics", interval_s=0.05, timeout_s=1.0) as scraper:
        result = await run_load(url, long_prompts(40), LoadOptions(model=MODEL, time_scale=10.0))
    level = scraper.result
    assert level is not None and level.before is not None and level.after is not None
    assert result.summary["completed"] == 40
    tel = from_scrape(level, max_num_seqs=128, max_num_batched_tokens=256)
    assert tel.request_success["length"] == 40 and tel.counters["generation_tokens"] == 400
    assert tel.samples > 3 and "running" in tel.gauges
    d = diagnose(tel, max_num_seqs=128, max_num_batched_tokens=256)
    assert d.kind == "token-budget-bound", d
    bare = from_scrape(replace(level, samples=()), max_num_seqs=128, max_num_batched_tokens=256)
    assert diagnose(bare, max_num_seqs=128, max_num_batched_tokens=256).kind == d.kind


# -- missed scrapes --------------------------------------------------------------------------


async def test_stalled_scrapes_are_counted_and_deltas_survive() -> None:
    """A /metrics that stalls mid-level (a saturated host): missed scrapes are counted, the
    level still gets its before/after pair and its deltas."""
    args, _ = SCENARIOS["memory-bound"]
    engine = Engine(get_model(MODEL), get_hardware(HW), args, seed=0, keep_history=False)
    sim = SimServer(engine, served_model_name=MODEL, model_path=MODEL, stats_interval=0)
    state: dict[str, Any] = {"stall": False, "calls": 0}

    async def metrics(_r: web.Request) -> web.Response:
        state["calls"] += 1
        if state["stall"]:
            await asyncio.sleep(0.5)
        return web.Response(body=sim.metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("/metrics"))
        scraper = Scraper(url, interval_s=0.05, timeout_s=0.1)
        assert await scraper.start() is not None
        state["stall"] = True
        # what the engine would have exported: preemptions under a too-small KV cache
        sim.metrics.observe_step(
            iteration_tokens=40,
            prompt_tokens=0,
            generation_tokens=40,
            running=40,
            waiting=20,
            kv_usage=1.0,
            preemptions=5,
            prefix_queries=0,
            prefix_hits=0,
        )
        await asyncio.sleep(0.5)
        state["stall"] = False
        level = await scraper.stop()
        assert level.stats.missed >= 3 and level.stats.timeouts >= 1
        assert level.after is not None
        tel = from_scrape(level, max_num_seqs=1024, max_num_batched_tokens=8192)
        assert tel.missed_scrapes == level.stats.missed
        assert tel.counters["preemptions"] == 5
        assert diagnose(tel, max_num_seqs=1024, max_num_batched_tokens=8192).kind == "memory-bound"
        async with aiohttp.ClientSession() as session:
            stats = ScrapeStats()
            assert await scrape(session, url.replace("/metrics", "/nope"), 1.0, stats) is None
            assert stats.attempts == 1 and stats.missed == 1


def test_sim_timeline_times_its_gaps_by_the_engine_cores_step_ends() -> None:
    """vLLM stamps its inter-token histogram with the engine core's clock, so an API server
    that streams slower than the engine steps does not reach it: on a front end of 2 ms per
    token the in-process record's gaps are the steps', shorter than the delivered ones
    (docs/simulator.md#5-metrics-and-logs)."""
    slow = replace(get_hardware(HW), sim_overrides=(("front_end.per_output_token", 2e-3),))
    reqs = [SimRequest(64, 32, arrival=0.0, request_id=str(i)) for i in range(8)]
    result = simulate(get_model(MODEL), slow, EngineArgs(max_model_len=2048), reqs, seed=0)
    itl = from_sim_timeline(result, 0.0, result.end, 2048, 8).histograms["itl"]
    engine = [g for r in result.requests for g in np.diff(r.engine_token_times)]
    delivered = [g for r in result.requests for g in np.diff(r.token_times)]
    assert itl.count == len(engine) == 8 * 31
    assert itl.sum == pytest.approx(sum(engine))
    assert sum(delivered) > 1.3 * sum(engine)
