"""The Prometheus refresh (docs/nightly.md#22-from-prometheus): the lognormal fit on 1-2-5
buckets, the 4xx warning, and, against the real Prometheus CI installs, a simulated server
scraped under a lognormal workload (sigma >= 0.8, 2,000 requests, lengths over at least
three 1-2-5 buckets): the fitted p50 and p90 prompt lengths lie within 15 % of the replayed
workload's."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import numpy as np
import pytest

from autotune.loadgen import LoadOptions, run_load
from autotune.nightly.job_config import NightlyConfig
from autotune.nightly.promfit import fit_lognormal, refresh_from_prometheus, rejected_warning
from autotune.sim.vllm_page import build_1_2_5_buckets
from autotune.telemetry import PrometheusTelemetry, write_sd_targets
from autotune.workers import SimWorker
from autotune.workload.core import WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def bucketed(values: np.ndarray, bounds: list[int]) -> dict[float, float]:
    out = {float(b): float(np.sum(values <= b)) for b in bounds}
    out[math.inf] = float(values.size)
    return out


def test_lognormal_fit_on_1_2_5_buckets() -> None:
    rng = np.random.default_rng(7)
    values = np.round(rng.lognormal(math.log(400), 0.9, 5000))
    fit = fit_lognormal(bucketed(values, build_1_2_5_buckets(65536)))
    for q in (0.5, 0.9):
        assert fit.quantile(q) == pytest.approx(np.quantile(values, q), rel=0.08), q
    assert fit.sigma == pytest.approx(0.9, abs=0.08) and fit.count == 5000
    with pytest.raises(ValueError, match="no observations"):
        fit_lognormal({math.inf: 0.0})
    with pytest.raises(ValueError, match="fewer than two"):
        fit_lognormal({100.0: 0.0, 200.0: 10.0, math.inf: 10.0})
    point = fit_lognormal({100.0: 0.0, 200.0: 10.0, math.inf: 10.0}, mean=150.0)
    assert point.sigma == 0.0 and point.quantile(0.9) == pytest.approx(150.0)


def test_rejected_requests_warn() -> None:
    assert rejected_warning(0.0, 100.0) is None
    w = rejected_warning(25.0, 75.0)
    assert w is not None and w.startswith("25 requests (25.0 %) got a 4xx answer")


def nightly(url: str) -> NightlyConfig:
    return NightlyConfig.model_validate(
        {
            "deployment": "chat",
            "traffic": {
                "source": "prometheus",
                "prometheus_url": url,
                "window_h": 0.05,
                "selector": 'trial="fit"',
                "num_prompts": 500,
            },
            "model": {"name": MODEL},
            "hardware": "H100-80GB",
            "slo": {"p99_ttft_ms": 3000},
            "output": "out.yaml",
        }
    )


@pytest.mark.prometheus
async def test_refresh_from_a_real_prometheus(
    prometheus: tuple[str, Path],
    tmp_path: Path,
) -> None:
    url, sd = prometheus
    w = SimWorker(
        model=MODEL,
        hardware="H100-80GB",
        workdir=tmp_path / "workers",
        time_scale=50.0,
        sim_startup_delay=0.0,
        startup_timeout_s=30,
    )
    info = await w.start({"max_model_len": 16384, "max_num_seqs": 512}, "fit")
    try:
        write_sd_targets(
            sd / "fit.json", [(info.base_url.removeprefix("http://"), {"trial": "fit"})]
        )
        rng = np.random.default_rng(11)
        prompts = np.clip(np.round(rng.lognormal(math.log(300), 0.9, 2000)), 1, 12000).astype(int)
        outputs = np.clip(np.round(rng.lognormal(math.log(8), 0.8, 2000)), 1, 200).astype(int)
        requests = [
            WorkloadRequest(
                prompt_len=int(p),
                output_len=int(o),
                request_id=f"r{i}",
                prompt_token_ids=tuple(int(x) % 30000 + 1 for x in range(i, i + int(p))),
            )
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
        ]
        assert (
            len({b for b in build_1_2_5_buckets(16384) if prompts.min() <= b <= prompts.max()}) >= 3
        )
        t0 = time.time()
        prom = PrometheusTelemetry(url, scrape_interval_s=0.5)
        # file_sd reaches the scrape loop within seconds: a scrape before the traffic
        await asyncio.to_thread(prom.wait_for_sample, "fit", t0, 30.0)
        result = await run_load(
            info.base_url, requests, LoadOptions(model=MODEL, max_concurrency=256)
        )
        assert result.summary["completed"] == 2000
        await asyncio.to_thread(prom.wait_for_sample, "fit", time.time(), 30.0)  # and after
        ref = await asyncio.to_thread(refresh_from_prometheus, nightly(url), at=time.time())
    finally:
        await w.stop()
    assert ref.profile.approximate_tail and ref.warnings == []
    for key, q in (("p50", 50), ("p90", 90)):
        want = float(np.percentile(prompts, q))
        got = ref.profile.prompt[key]
        print(f"prompt {key}: fitted {got:.0f}, replayed {want:.0f}")
        assert got == pytest.approx(want, rel=0.15), key
    assert ref.workload["source"] == "synthetic" and ref.workload["input_sigma"] >= 0.7
    assert time.time() - t0 < 180
