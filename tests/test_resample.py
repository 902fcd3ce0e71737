"""Resampling a trace for validation repeats (autotune/workload/resample.py,
docs/tuning.md#7-validation): the stratified bootstrap keeps the trace's rare long request in
every sample, and on a trace whose p99 hangs on that request validation's paired interval
resolves a true +10 % gain, where the plain bootstrap does not."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from support.studies import config

from autotune.tuning.measure.interval import paired_interval
from autotune.tuning.measure.validate import repeat_seeds
from autotune.workload.build import workload_sample
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.rare_trace import rare_request_trace
from autotune.workload.resample import BAND, bootstrap, stratified_bootstrap

N = 400


def _trace(seed: int) -> tuple[Workload, str]:
    """400 requests (log-normal lengths, Poisson arrivals at 4 req/s), one of them 5x longer
    (prompt + output) than the 99th percentile; returns it and the rare request's id."""
    tr = rare_request_trace(seed, N)
    reqs = [
        WorkloadRequest(tr.prompt[i], tr.output[i], arrival=tr.arrival[i], request_id=f"r{i}")
        for i in range(N)
    ]
    return Workload(reqs, "trace"), f"r{tr.rare}"


def _lengths(wl: Workload) -> list[int]:
    return [r.prompt_len + r.output_len for r in wl.requests]


def test_every_sample_keeps_the_rare_request_in_its_place(tmp_path: Path) -> None:
    wl, rare = _trace(0)
    at = next(r.arrival for r in wl.requests if r.request_id == rare)
    trace_sorted = sorted(_lengths(wl))
    plain_missed = 0
    for seed in range(20):
        s = stratified_bootstrap(wl, seed)
        kept = [r for r in s.requests if r.request_id.split("~")[0] == rare]
        assert [r.arrival for r in kept] == [at]
        assert [r.arrival for r in s.requests] == [r.arrival for r in wl.requests]
        # every other request comes from its own length band: the sample's i-th shortest
        # lies within one band of the trace's i-th shortest
        for i, x in enumerate(sorted(_lengths(s))):
            assert trace_sorted[max(0, i - BAND)] <= x <= trace_sorted[min(N - 1, i + BAND)]
        plain = bootstrap(wl, seed)
        plain_missed += not any(r.request_id.split("~")[0] == rare for r in plain.requests)
    assert plain_missed >= 3  # about 37 % of plain samples lack it
    # a trace source's validation repeats are drawn this way
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"ts": r.arrival, "in": r.prompt_len, "out": r.output_len}) + "\n"
            for r in wl.requests
        )
    )
    cols = {"timestamp": "ts", "input_length": "in", "output_length": "out"}
    cfg = config(
        workload={
            "source": "trace",
            "path": str(path),
            "columns": cols,
            "arrival": "trace",
            "rate": None,
            "num_prompts": N,
        }
    )[0]
    longest = max(_lengths(wl))
    for r in range(5):
        sample, how = workload_sample(cfg, repeat_seeds(cfg, r)[0], vocab_size=32000)
        assert _lengths(sample).count(longest) == 1 and "stratified by length" in how


# -- a true +10 % gain on a trace whose p99 TTFT hangs on its rare request ------------------
# Requests queue first come, first served. Config A has one lane at SPEED tokens/s; config B
# has two lanes, each slower, so the rare request blocks only half of B while it blocks all
# of A. Without the rare request A serves more, with it B does: the gain depends on whether
# a sample holds it. B's lane speed is set per trace so that B's capacity on the trace itself
# is exactly 1.10x A's. Each run draws 1.5 % speed jitter per config.
SPEED, SLO_S = 20_000.0, 2.0


def _p99_ttft(arrivals: list[float], work: list[int], lanes: int, speed: float) -> float:
    free, ttft = [0.0, 0.0], []
    for t, w in zip(arrivals, work, strict=True):
        j = 0 if lanes == 1 or free[0] <= free[1] else 1
        free[j] = max(free[j], t) + w / speed
        ttft.append(free[j] - t)
    return sorted(ttft)[-(N - int(0.99 * N))]


def _capacity(wl: Workload, lanes: int, speed: float) -> float:
    """The largest rate multiple (bisection on a log scale) at which p99 TTFT <= SLO_S."""
    arr, work = [r.arrival or 0.0 for r in wl.requests], _lengths(wl)
    lo, hi = math.log(0.01), math.log(100.0)
    for _ in range(18):
        mid = 0.5 * (lo + hi)
        ok = _p99_ttft([a / math.exp(mid) for a in arr], work, lanes, speed) <= SLO_S
        lo, hi = (mid, hi) if ok else (lo, mid)
    return math.exp(lo)


def _lane_speed_for_ten_percent(wl: Workload) -> float:
    goal = 1.10 * _capacity(wl, 1, SPEED)
    lo, hi = math.log(SPEED / 10), math.log(SPEED * 10)
    for _ in range(18):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _capacity(wl, 2, math.exp(mid)) < goal else (lo, mid)
    return math.exp(hi)


def test_validation_resolves_a_ten_percent_gain_on_a_trace_with_one_rare_request() -> None:
    resolved = {"stratified": 0, "plain": 0}
    for seed in range(10):
        wl, _ = _trace(seed)
        lane = _lane_speed_for_ten_percent(wl)
        for name, resample in (("stratified", stratified_bootstrap), ("plain", bootstrap)):
            gains = []
            for r in range(5):  # validation's default repeats in slo-capacity mode
                sample = resample(wl, 1000 * seed + r)
                za, zb = np.random.default_rng([seed, r]).standard_normal(2) * 0.015
                a = _capacity(sample, 1, SPEED * math.exp(za))
                b = _capacity(sample, 2, lane * math.exp(zb))
                gains.append(100 * (b / a - 1))
            # validation's interval: 95 %, the deviation floored at one 1 % lattice step
            iv = paired_interval(gains, 0.95, 1.0)
            resolved[name] += iv.low > 0
    assert resolved["stratified"] >= 9, resolved
    # the plain bootstrap drops or doubles the rare request, and the gain swings with it
    assert resolved["plain"] <= 7, resolved
