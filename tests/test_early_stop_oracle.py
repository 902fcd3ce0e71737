"""The early-stop oracle of the tuning-quality benchmark (benchmarks/early_stop_oracle.py): the
latest send among the k requests a limit needs is a bound no sound rule beats, so the
product's rule (autotune/sim/stop_watch.py) never stops a simulated level before it, and a
level the oracle cannot cut never stops."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.studies import config

from autotune.loadgen.stop_rule import StopRule, needed
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import SimWatch, sim_engine_args, sim_requests
from autotune.sim.virtual_loop import simulate
from autotune.workload.build import build_workload, scale_rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from early_stop_oracle import level_oracle

MODEL, HW = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_hardware("A100-80GB")


def _req(i: int, arrival: float, ttft: float, tpot: float = 0.02, n: int = 10) -> Any:
    first = arrival + ttft
    times = first + tpot * np.arange(n)
    return SimpleNamespace(
        request_id=f"r{i}",
        arrival=arrival,
        rejected=False,
        finish=float(times[-1]),
        truncated=False,
        token_times=times,
        ttft=ttft,
        e2e=float(times[-1]) - arrival,
        warmup=False,
    )


def test_the_oracle_stops_at_the_send_of_the_kth_request_over_the_slo() -> None:
    cfg = config(slo={"p99_ttft_ms": 1000.0, "p99_tpot_ms": None})[0]
    # 200 requests, one every 0.1 s; needed(200) = 3: requests 50, 120 and 150 are slow
    reqs = [_req(i, 0.1 * i, 5.0 if i in (50, 120, 150) else 0.2) for i in range(200)]
    res = SimpleNamespace(requests=reqs, end=reqs[-1].finish)
    full, cut = level_oracle(cfg, res)
    assert needed(200) == 3
    assert full == pytest.approx(reqs[-1].finish) and cut == pytest.approx(15.0)
    # two slow requests leave the p99 below the limit: nothing to cut
    fast = [_req(i, 0.1 * i, 5.0 if i in (50, 120) else 0.2) for i in range(200)]
    assert level_oracle(cfg, SimpleNamespace(requests=fast, end=fast[-1].finish))[1] is None


@pytest.mark.parametrize(
    ("scale", "mns", "mnbt", "reason"),
    [
        (2.5, 64, 2048, None),  # feasible: neither stops
        (3.0, 16, 2048, "p99_ttft"),
        (8.0, 16, 512, "p99_ttft"),
        (4.0, 256, 2048, "p99_tpot"),
        (8.0, 64, 2048, "p99_tpot"),
    ],
)
def test_the_rule_never_stops_a_level_before_the_oracle(
    scale: float, mns: int, mnbt: int, reason: str | None
) -> None:
    cfg = config(slo={"p99_ttft_ms": 3000.0, "p99_tpot_ms": 45.0})[0]
    wl = build_workload(cfg.workload, vocab_size=MODEL.vocab_size)
    reqs = sim_requests(scale_rate(wl, scale))
    engine_args = {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": mns,
        "max_num_batched_tokens": mnbt,
    }
    args = sim_engine_args(engine_args, {})
    full = simulate(MODEL, HW, args, reqs, seed=1)
    watch = SimWatch(StopRule(3000.0, 45.0), len(reqs))
    stopped = simulate(MODEL, HW, args, reqs, seed=1, stop=watch)
    start = min(r.arrival for r in full.requests)
    replayed, oracle = level_oracle(cfg, full)
    assert replayed == pytest.approx(full.end - start)
    assert watch.reason == reason
    if reason is None:
        assert stopped.stopped_at is None and oracle is None
        return
    assert stopped.stopped_at is not None and oracle is not None and not math.isnan(oracle)
    # the rule counts only requests already sent, so it stops at or after the oracle
    assert oracle <= stopped.stopped_at - start < full.end - start
