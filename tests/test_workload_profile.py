"""Workload profile: percentiles, rates, concurrency, and a fingerprint stable across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from autotune.workload import Workload, WorkloadRequest, peak_rate

# One script builds the workload in this process and in a fresh interpreter.
BUILD = """
from autotune.workload import arrivals, random_workload, sharegpt_like_workload, Workload
a = sharegpt_like_workload(300, seed=3).with_arrivals(arrivals.gamma(300, 7.0, 0.5, seed=3))
b = random_workload(40, input_len=64, output_len=8, prefix_len=16, seed=1)
w = Workload(a.requests + [r for r in b.requests], "mixed").with_arrivals(
    arrivals.poisson(340, 9.0, seed=4))
"""


def hand_workload() -> Workload:
    prompts, outputs = [10, 20, 30, 40, 1000], [5, 5, 5, 5, 50]
    times = [0.0, 0.5, 0.9, 5.0, 20.0]
    reqs = [
        WorkloadRequest(p, o, arrival=t, request_id=str(i))
        for i, (p, o, t) in enumerate(zip(prompts, outputs, times, strict=True))
    ]
    return Workload(reqs, "hand")


def test_profile_percentiles_match_numpy_on_a_hand_example() -> None:
    prof = hand_workload().profile()
    prompts = np.array([10, 20, 30, 40, 1000])
    totals = prompts + np.array([5, 5, 5, 5, 50])
    assert prof.num_requests == 5
    for stats, values in ((prof.prompt_len, prompts), (prof.total_len, totals)):
        assert stats.p50 == np.percentile(values, 50)
        assert stats.p95 == np.percentile(values, 95)  # linear interpolation, like vLLM
        assert stats.p99 == np.percentile(values, 99)
        assert stats.max == values.max() and stats.mean == values.mean()
    assert prof.prompt_len.p95 == pytest.approx(808.0)  # 40 + 0.8 * (1000 - 40)
    assert prof.output_len.max == 50
    assert prof.duration_s == 20.0 and prof.mean_rate == 5 / 20.0
    assert prof.peak_rate_1s == 3.0  # 0, 0.5, 0.9 fall in [0, 1)
    assert prof.peak_rate_10s == 0.4  # four of them in [0, 10)
    assert prof.peak_concurrency is None and not prof.closed_loop
    assert hand_workload().profile(peak_concurrency=3).peak_concurrency == 3
    json.dumps(prof.to_dict())  # plain data for the study store


def test_peak_rate_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 30, 200))
    for window in (1.0, 10.0):
        brute = max(np.sum((t >= s) & (t < s + window)) for s in t) / window
        assert peak_rate(t, window) == brute
    all_at_zero = np.zeros(7)
    assert peak_rate(all_at_zero, 1.0) == 7.0 and peak_rate(np.array([]), 1.0) == 0.0


def test_fingerprint_is_stable_across_processes() -> None:
    scope: dict[str, object] = {}
    exec(BUILD, scope)  # the very script the subprocess runs
    here = scope["w"].fingerprint()  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str hash() salt
    out = subprocess.run(
        [sys.executable, "-c", BUILD + "print(w.fingerprint())"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.strip() == here
    assert len(here) == 64 and int(here, 16) >= 0


def test_fingerprint_changes_with_what_the_server_sees_only() -> None:
    w = hand_workload()
    base = w.fingerprint()
    assert w.profile().fingerprint == base

    def with_request(i: int, **changes: object) -> Workload:
        reqs = list(w.requests)
        reqs[i] = replace(reqs[i], **changes)  # type: ignore[arg-type]
        return Workload(reqs, w.source)

    assert with_request(2, output_len=6).fingerprint() != base
    assert with_request(2, prompt_len=31).fingerprint() != base
    assert with_request(2, arrival=0.95).fingerprint() != base
    assert with_request(2, prompt_text="x " * 30).fingerprint() != base
    assert with_request(2, request_id="renamed").fingerprint() == base
    assert Workload(list(w.requests), "elsewhere/path").fingerprint() == base
    assert w.closed_loop(2).fingerprint() != w.closed_loop(3).fingerprint()
    ids = WorkloadRequest(3, 1, prompt_token_ids=(20, 21, 22), request_id="t")
    assert (
        Workload([ids], "").fingerprint()
        != Workload([replace(ids, prompt_token_ids=(20, 21, 23))], "").fingerprint()
    )
