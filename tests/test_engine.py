"""The in-process engine API: simulate(), timings, timeline, jitter, clocks, lengths."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from autotune.errors import SimStartupError
from autotune.failures import FailureClass
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.clock import RealClock, VirtualClock
from autotune.sim.engine import Engine
from autotune.sim.frontend import DEFAULT_FRONT_END, NO_FRONT_END
from autotune.sim.lengths import lognormal_requests
from autotune.sim.request import SimRequest
from autotune.sim.virtual_loop import simulate

LLAMA = get_model("meta-llama/Llama-3.1-8B-Instruct")
H100 = get_hardware("H100-80GB")


def test_single_request_timings_follow_the_cost_model() -> None:
    res = simulate(LLAMA, H100, EngineArgs(max_model_len=4096), [SimRequest(1000, 10)], jitter_cv=0)
    (r,) = res.requests
    assert len(r.token_times) == 10 and np.all(np.diff(r.token_times) > 0)
    fe = DEFAULT_FRONT_END
    # the API server tokenizes it first, and detokenizes and streams every token
    assert r.scheduled == pytest.approx(fe.per_request + 1000 * fe.per_prompt_token)
    assert r.first_token == r.token_times[0] and r.finish == r.token_times[-1]
    eng = Engine(LLAMA, H100, EngineArgs(max_model_len=4096), jitter_cv=0)
    assert r.ttft == pytest.approx(
        r.scheduled + eng.cost.prefill_time(1000) + fe.per_step + fe.per_output_token
    )
    # decode steps at batch 1 cost a few ms on an H100 (5-6.5 ms in
    # docs/simulator.md#7-published-anchors)
    assert 0.004 < r.tpot < 0.008
    assert res.summary()["completed"] == 1


def test_queueing_shows_in_ttft_when_max_num_seqs_binds() -> None:
    reqs = [SimRequest(200, 50) for _ in range(8)]
    # the engine's own queue alone: no API server in front
    wide = simulate(
        LLAMA, H100, EngineArgs(max_model_len=2048, max_num_seqs=8), reqs, front_end=NO_FRONT_END
    )
    narrow = simulate(
        LLAMA, H100, EngineArgs(max_model_len=2048, max_num_seqs=2), reqs, front_end=NO_FRONT_END
    )
    assert narrow.summary()["p99_ttft_ms"] > 3 * wide.summary()["p99_ttft_ms"]
    assert narrow.timeline.running.max() == 2 and narrow.timeline.waiting.max() == 6
    queue = [r.scheduled - r.arrival for r in narrow.requests]
    assert max(queue) > 0 and min(queue) == 0


def test_max_model_len_rules_follow_real_vllm() -> None:
    """vLLM 0.32 (captured in tests/data/vllm032): a prompt reaching max_model_len is refused;
    a shorter prompt whose output would not fit is served with its output cut."""
    res = simulate(
        LLAMA,
        H100,
        EngineArgs(max_model_len=1024),
        [
            SimRequest(1000, 100, request_id="cut"),
            SimRequest(10, 10),
            SimRequest(1100, 10, request_id="over"),
            SimRequest(1024, 10, request_id="equal"),
        ],
    )
    by = {r.request_id: r for r in res.requests}
    cut = by["cut"]
    assert not cut.rejected and cut.truncated and cut.output_len == 24
    over, equal = by["over"], by["equal"]
    assert over.rejected and over.reject_reason == (
        "This model's maximum context length is 1024 tokens. However, your prompt contains "
        "1100 input tokens, which exceeds this limit even without any output tokens. Please "
        "reduce the length of the input prompt. (parameter=input_tokens, value=1100)"
    )
    assert equal.rejected and equal.reject_reason == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )
    assert res.summary()["completed"] == 2 and res.summary()["rejected"] == 2


def test_startup_failure_raises_before_any_step() -> None:
    with pytest.raises(SimStartupError) as ei:
        simulate(
            LLAMA,
            H100,
            EngineArgs(max_num_seqs=512, max_num_batched_tokens=256),
            [SimRequest(10, 10)],
        )
    assert ei.value.failure_class is FailureClass.MNBT_LT_MNS


def test_memory_pressure_causes_preemptions_and_full_kv() -> None:
    # A small KV cache (kv_cache_memory_bytes) and long outputs: V1 preempts by recompute.
    args = EngineArgs(max_model_len=2048, kv_cache_memory_bytes=2 * 1024**3)
    reqs = lognormal_requests(200, 256, 1024, seed=1, max_output=1700)
    res = simulate(LLAMA, H100, args, reqs)
    assert res.num_preemptions > 0
    assert res.timeline.kv_usage.max() > 0.95
    assert np.all(np.diff(res.timeline.preemptions) >= 0)
    assert sum(r.preemptions for r in res.requests) == res.num_preemptions
    assert all(len(r.token_times) == r.output_len for r in res.requests)


def test_jitter_is_seeded_and_zero_is_deterministic() -> None:
    reqs = lognormal_requests(50, 256, 64, seed=3)
    # no API server: every request reaches the engine at once, so the steps line up
    args, bare = EngineArgs(max_model_len=4096), NO_FRONT_END
    a = simulate(LLAMA, H100, args, reqs, seed=7, front_end=bare)
    b = simulate(LLAMA, H100, args, reqs, seed=7, front_end=bare)
    c = simulate(LLAMA, H100, args, reqs, seed=8, front_end=bare)
    z = simulate(LLAMA, H100, args, reqs, jitter_cv=0, front_end=bare)
    assert a.summary() == b.summary()
    assert a.summary()["duration_s"] != c.summary()["duration_s"]
    # default jitter ~1.5 % CV per step: totals move by well under 5 %
    assert a.summary()["duration_s"] == pytest.approx(z.summary()["duration_s"], rel=0.05)
    steps = np.diff(np.concatenate([[0.0], a.timeline.t]))
    zsteps = np.diff(np.concatenate([[0.0], z.timeline.t]))
    ratio = steps / zsteps
    assert 0.005 < ratio.std() < 0.03


def test_arrivals_with_idle_gaps_jump_the_virtual_clock() -> None:
    reqs = [SimRequest(100, 5, arrival=0.0), SimRequest(100, 5, arrival=100.0)]
    res = simulate(LLAMA, H100, EngineArgs(max_model_len=1024), reqs)
    second = res.requests[1]
    # scheduled once the (idle) API server has tokenized it
    ready = 100.0 + DEFAULT_FRONT_END.per_request + 100 * DEFAULT_FRONT_END.per_prompt_token
    assert second.scheduled == pytest.approx(ready) and second.first_token > ready
    assert res.summary()["duration_s"] > 100


def test_timeline_reports_vllm_metric_quantities() -> None:
    args = EngineArgs(max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=1024)
    res = simulate(LLAMA, H100, args, lognormal_requests(100, 512, 128, seed=0))
    tl = res.timeline
    n = res.num_steps
    assert all(len(a) == n for a in (tl.t, tl.running, tl.waiting, tl.kv_usage, tl.tokens))
    assert tl.running.max() <= 16 and tl.tokens.max() <= 1024
    assert np.all((tl.kv_usage >= 0) & (tl.kv_usage <= 1))
    assert np.array_equal(tl.tokens, tl.prefill_tokens + tl.decode_tokens)
    assert tl.prefill_tokens.sum() >= sum(r.prompt_len for r in res.requests)
    assert tl.decode_tokens.sum() + sum(1 for _ in res.requests) >= sum(
        r.output_len for r in res.requests
    )


def test_lognormal_requests_are_seeded_with_the_asked_means() -> None:
    a = lognormal_requests(4000, 512, 256, seed=1)
    assert a == lognormal_requests(4000, 512, 256, seed=1)
    assert np.mean([r.prompt_len for r in a]) == pytest.approx(512, rel=0.05)
    assert np.mean([r.output_len for r in a]) == pytest.approx(256, rel=0.05)
    timed = lognormal_requests(2000, 100, 10, seed=2, rate=20.0)
    gaps = np.diff([r.arrival for r in timed])
    assert np.all(gaps >= 0) and np.mean(gaps) == pytest.approx(1 / 20, rel=0.1)
    with pytest.raises(ValueError):
        lognormal_requests(10, 100, 10, rate=0)


def test_virtual_clock_jumps_and_never_goes_back() -> None:
    c = VirtualClock()
    c.advance_to(5.0)
    c.advance_to(3.0)
    assert c.now() == 5.0
    asyncio.run(c.sleep_until(7.5))
    assert c.now() == 7.5


def test_real_clock_runs_scaled() -> None:
    c = RealClock(scale=100.0)
    t0, w0 = c.now(), time.monotonic()
    asyncio.run(c.sleep_until(t0 + 5.0))  # 5 engine seconds = 50 ms of wall time
    assert 0.045 <= time.monotonic() - w0 < 0.5
    assert c.now() >= t0 + 5.0
    with pytest.raises(ValueError):
        RealClock(scale=0)
