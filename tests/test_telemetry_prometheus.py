"""Prometheus mode against a real Prometheus (Debian's package) scraping a simulated vLLM
found through file-based service discovery: its summaries must agree with direct scraping.

Prometheus runs on a free loopback port with a generated config, a 0.5 s scrape interval and
a temp storage folder, and is killed in teardown. A second target serves the same server's
page under vLLM's older metric names, so the PromQL aliases are checked on the same traffic.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.prometheus import INTERVAL

from autotune.errors import ServiceError
from autotune.loadgen import LoadOptions, run_load
from autotune.telemetry import (
    LevelTelemetry,
    PrometheusTelemetry,
    Scraper,
    diagnose,
    from_scrape,
    write_sd_targets,
)
from autotune.telemetry.summary import GAUGES
from autotune.workers import SimWorker
from autotune.workload.core import WorkloadRequest

pytestmark = pytest.mark.prometheus

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MNS, MNBT = 8, 8192
OLD_NAMES = {
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
    "vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds",
    "vllm:prefix_cache_queries": "vllm:gpu_prefix_cache_queries",
    "vllm:prefix_cache_hits": "vllm:gpu_prefix_cache_hits",
}


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[str]:
    w = SimWorker(
        model=MODEL,
        hardware="H100-80GB",
        workdir=tmp_path / "workers",
        time_scale=1.0,
        sim_startup_delay=0.0,
        startup_timeout_s=30,
    )
    info = await w.start({"max_model_len": 2048, "max_num_seqs": MNS}, "t1")
    try:
        yield info.base_url
    finally:
        await w.stop()


@pytest.fixture
async def old_names_proxy(worker: str) -> AsyncIterator[str]:
    """The worker's page under pre-0.11 names (as vLLM 0.8-0.10 exposed them)."""
    async with aiohttp.ClientSession() as session:

        async def metrics(_r: web.Request) -> web.Response:
            async with session.get(worker + "/metrics") as resp:
                text = await resp.text()
            for new, old in OLD_NAMES.items():
                text = text.replace(new, old)
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app, host="127.0.0.1") as server:
            yield f"127.0.0.1:{server.port}"


def within(a: float, b: float, rel: float = 0.05) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-9


def assert_agree(direct: LevelTelemetry, prom: LevelTelemetry) -> None:
    assert prom.has_deltas and direct.has_deltas
    for key, value in direct.counters.items():
        assert within(prom.counters[key], value), (key, prom.counters[key], value)
    assert within(prom.finished, direct.finished)
    for key, h in direct.histograms.items():
        assert within(prom.histograms[key].count, h.count), key
        assert within(prom.histograms[key].sum, h.sum), key


async def test_prometheus_mode_agrees_with_direct_scraping(
    prometheus: tuple[str, Path], worker: str, old_names_proxy: str
) -> None:
    url, sd = prometheus
    write_sd_targets(
        sd / "autotune.json",
        [(worker.removeprefix("http://"), {"trial": "t1"}), (old_names_proxy, {"trial": "t1-old"})],
    )
    prom = PrometheusTelemetry(url, scrape_interval_s=INTERVAL)
    await asyncio.to_thread(prom.check)
    for trial in ("t1", "t1-old"):  # file_sd updates reach the scrape loop within ~5 s
        await asyncio.to_thread(prom.wait_for_sample, trial, time.time(), 30.0)

    # 48 requests against max_num_seqs=8: a concurrency cap for ~5 s
    requests = [
        WorkloadRequest(
            prompt_len=200,
            output_len=100,
            request_id=f"r{i}",
            prompt_token_ids=tuple(range(i + 1, i + 201)),
        )
        for i in range(48)
    ]
    scraper = Scraper(worker + "/metrics", interval_s=INTERVAL)
    before = await scraper.start()
    result = await run_load(worker, requests, LoadOptions(model=MODEL))
    await asyncio.sleep(2.5 * INTERVAL)  # Prometheus scrapes the drained server before `after`
    level = await scraper.stop()
    assert before is not None and level.after is not None
    assert result.summary["completed"] == 48
    for trial in ("t1", "t1-old"):
        await asyncio.to_thread(prom.wait_for_sample, trial, level.after.t, 10.0)

    direct = from_scrape(level, max_num_seqs=MNS, max_num_batched_tokens=MNBT)
    via_prom = await asyncio.to_thread(
        prom.level, "t1", before.t, level.after.t, max_num_seqs=MNS, max_num_batched_tokens=MNBT
    )
    assert via_prom.source == "prometheus" and direct.counters["generation_tokens"] == 4800
    assert_agree(direct, via_prom)
    assert via_prom.request_success["length"] == pytest.approx(48, rel=1e-3)
    # Gauge maxima: equal up to what one scrape interval's sampling can miss.
    for key in ("running", "waiting", "kv_usage"):
        values = [s.gauges[GAUGES[key]] for s in level.samples]
        step = max(abs(b - a) for a, b in itertools.pairwise(values))
        assert abs(via_prom.gauges[key].max - direct.gauges[key].max) <= step + 1e-9, key
    assert via_prom.gauges["running"].max == direct.gauges["running"].max == MNS
    assert via_prom.cache_config is not None and "num_gpu_blocks" in via_prom.cache_config
    kinds = {
        diagnose(t, max_num_seqs=MNS, max_num_batched_tokens=MNBT).kind for t in (direct, via_prom)
    }
    assert kinds == {"concurrency-capped"}

    # The same traffic under the older names: the aliases find every family.
    old = await asyncio.to_thread(
        prom.level, "t1-old", before.t, level.after.t, max_num_seqs=MNS, max_num_batched_tokens=MNBT
    )
    assert_agree(direct, old)
    assert "kv_usage" in old.gauges and "itl" in old.histograms
    assert "prefix_cache_queries" in old.counters

    with pytest.raises(ServiceError, match="no scrape of trial 'nobody'"):
        await asyncio.to_thread(prom.wait_for_sample, "nobody", 0.0, 0.5)
