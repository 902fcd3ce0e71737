"""Levels long enough to load the server (docs/tuning.md#13-level-length): the sample looped
until a level lasts ``strategy.min_level_s`` engine seconds at its load and holds
``strategy.min_level_requests`` requests.

Pure tests of the loop first (rate, length, ids, content, closed loops, the unchanged case),
then the simulator: a short sample at a high load is a burst a server absorbs in its queue, so
its capacity without the minimum is far above what the server sustains; with it, the short
sample's capacity is that of a long sample.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.studies import config

from autotune.errors import ConfigError
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.tuning.measure.level_plan import LevelPlan, measure
from autotune.tuning.measure.outcome import level_record, replay_seconds
from autotune.tuning.measure.protocol import measure_config, study_protocol
from autotune.tuning.measure.runner_protocol import offered_rate
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.workload import LogNormal, arrivals, random_workload, synthetic_workload
from autotune.workload.build import build_workload
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.sustain import MAX_LEVEL_REQUESTS, copies_needed, sample_requests, sustain

MODEL = get_model("meta-llama/Llama-3.1-8B-Instruct")
HW = get_hardware("A100-80GB")


def sample(n: int = 50, rate: float = 5.0, seed: int = 0) -> Workload:
    wl = synthetic_workload(n, LogNormal(256, 0.5), LogNormal(64, 0.5), seed=seed)
    return wl.with_arrivals(arrivals.poisson(n, rate, seed), f"poisson {rate}")


# -- the loop, pure ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    rate=st.floats(0.5, 50),
    scale=st.floats(0.25, 16),
    min_s=st.floats(0, 120),
    min_n=st.integers(0, 400),
)
def test_the_loop_reaches_both_minimums_with_the_fewest_whole_copies_at_the_same_rate(
    n: int, rate: float, scale: float, min_s: float, min_n: int
) -> None:
    wl = sample(n, rate)
    looped = sustain(wl, scale, min_s, min_n)
    k = len(looped) // n
    assert len(looped) == k * n and k == copies_needed(wl, scale, min_s, min_n)
    t, lt = wl.arrivals(), looped.arrivals()
    assert t is not None and lt is not None
    assert lt[-1] / scale >= min_s - 1e-9 * min_s and len(looped) >= min_n
    if k > 1:  # one copy fewer would miss a minimum
        assert (k - 1) * n < min_n or t[-1] * (k - 1) / scale < min_s
        # the offered rate (requests over the last arrival) is the sample's, exactly
        assert len(lt) / lt[-1] == pytest.approx(n / t[-1], rel=1e-12)
        if n > 1:
            assert offered_rate(looped, scale) == pytest.approx(offered_rate(wl, scale))
        assert np.all(np.diff(lt) >= 0)
    else:
        assert looped is wl


def test_copy_k_follows_copy_k_minus_1_by_the_samples_first_gap() -> None:
    wl = sample(40, 4.0)
    t = wl.arrivals()
    assert t is not None
    looped = sustain(wl, 4.0, 30.0, 0)  # 10 s at 1x, 2.5 s at 4x: 12 copies for 30 s
    assert len(looped) == 12 * 40
    lt = looped.arrivals()
    assert lt is not None
    for k in range(1, 12):
        copy = lt[k * 40 : (k + 1) * 40]
        np.testing.assert_allclose(copy, t + k * t[-1])  # the sample's timeline, shifted
        assert copy[0] - lt[k * 40 - 1] == pytest.approx(t[0])  # its first gap, 1/rate on avg
    # the lengths are the sample's, copy by copy
    lens = [(r.prompt_len, r.output_len) for r in wl.requests]
    assert [(r.prompt_len, r.output_len) for r in looped.requests] == lens * 12
    assert "looped x12" in looped.source


def test_copies_have_fresh_ids_and_new_content_of_the_same_length() -> None:
    wl = sample(30, 10.0)  # lengths only: the prompt is generated from the id
    looped = sustain(wl, 1.0, 0.0, 100)  # 4 copies
    ids = [r.request_id for r in looped.requests]
    assert len(set(ids)) == len(ids) == 120
    for i, r in enumerate(wl.requests):
        copies = looped.requests[i::30]
        for accepts_ids in (True, False):
            prompts = [c.prompt(accepts_ids, 32000) for c in copies]
            assert all(p != prompts[0] for p in prompts[1:])
        assert len(copies[1].prompt(True, 32000)) == r.prompt_len
    # given text is not repeated: a copy sends a generated prompt of the same length
    text = Workload(
        [WorkloadRequest(3, 4, prompt_text="the real text", arrival=0.5, request_id="s0")],
        "sharegpt",
    )
    tl = sustain(text, 1.0, 1.0, 0)
    assert tl.requests[0].prompt_text == "the real text"
    assert tl.requests[1].prompt_text is None and tl.requests[1].prompt_len == 3
    assert tl.requests[1].prompt(False) != "the real text"


def test_given_token_ids_are_renamed_keeping_the_prefixes_a_copy_shares() -> None:
    wl = random_workload(20, input_len=64, output_len=8, prefix_len=32, seed=3)
    wl = wl.with_arrivals(arrivals.constant(20, 2.0))
    looped = sustain(wl, 1.0, 0.0, 60)
    prompts = [r.prompt_token_ids for r in looped.requests]
    assert all(p is not None for p in prompts)
    used = {t for r in wl.requests for t in r.prompt_token_ids or ()}
    for c in range(3):
        copy = [p for p in prompts[c * 20 : (c + 1) * 20] if p is not None]
        assert all(len(p) == r.prompt_len for p, r in zip(copy, wl.requests, strict=True))
        assert {p[:32] for p in copy} == {copy[0][:32]}  # the shared prefix stays shared
        assert set().union(*copy) <= used  # ids the sample itself uses
        for d in range(c):  # no copy starts a block as another copy does: no cache hit
            other = prompts[d * 20 : (d + 1) * 20]
            assert {p[:16] for p in copy}.isdisjoint({p[:16] for p in other if p})


def test_a_closed_loop_or_a_burst_gets_only_the_request_minimum() -> None:
    wl = sample(50).closed_loop(8)
    looped = sustain(wl, 4.0, 1e4, 120)
    assert len(looped) == 150 and looped.closed_loop_concurrency == 8
    assert all(r.arrival is None for r in looped.requests)
    assert sustain(wl, 4.0, 1e4, 50) is wl  # no span to stretch: the duration cannot apply
    burst = sample(50).with_arrivals(arrivals.all_at_once(50))
    assert len(sustain(burst, 1.0, 60.0, 120)) == 150
    assert sustain(burst, 1.0, 60.0, 0) is burst


def test_a_sample_long_enough_is_the_same_object() -> None:
    wl = sample(200, 2.0)  # 100 s at 1x
    assert sustain(wl, 1.0, 30.0, 200) is wl
    assert sustain(wl, 3.0, 30.0, 200) is wl  # 33 s at 3x
    assert sustain(wl, 4.0, 0.0, 0) is wl  # minimums off
    assert len(sustain(wl, 4.0, 30.0, 200)) == 400  # 25 s at 4x: one more copy
    with pytest.raises(ValueError, match="scale"):
        sustain(wl, 0.0, 30.0, 0)


def test_a_sample_that_would_loop_past_the_cap_is_one_line_naming_the_field() -> None:
    # 3 requests in 3 ms: a day at 16x would be 1.4e9 copies
    wl = sample(3, 1000.0)
    assert len(sustain(wl, 16.0, 30.0, 0)) <= MAX_LEVEL_REQUESTS
    with pytest.raises(ConfigError, match=r"strategy\.min_level_s 86400 s at load x16: the 3-"):
        sustain(wl, 16.0, 86400.0, 0)


# -- the config, the plan and the stored level ----------------------------------------------
@pytest.mark.config_field("strategy.min_level_requests")
def test_min_level_requests_sets_what_a_level_replays_and_the_level_says_so() -> None:
    # fixed-rate: one level at 1.0x of the 120-request sample (30 s at 4 req/s)
    runs: dict[int, Any] = {}
    for n in (0, 200, 400):
        cfg, _ = config(mode="fixed-rate", strategy={"min_level_requests": n})
        plan = LevelPlan.of(cfg)
        assert plan.min_level_requests == n and plan.min_level_s == 30.0
        wl = build_workload(cfg.workload, vocab_size=MODEL.vocab_size)
        runner = VirtualRunner(MODEL, HW, model_name="m", static_args={}, seed=0, jitter_cv=0.0)

        async def go(r: VirtualRunner = runner, p: LevelPlan = plan, w: Workload = wl) -> Any:
            await r.start({}, "t")
            return await measure(r, w, p)

        m = asyncio.run(go())
        (lv,) = m.levels
        runs[n] = level_record(lv.index, lv.outcome, lv.score)
    assert runs[0].completed + runs[0].failed == 120
    assert sample_requests(runs[0].metrics) is None  # the sample as it is
    assert runs[200].completed + runs[200].failed == 240
    assert runs[400].completed + runs[400].failed == 480
    for n in (200, 400):
        assert sample_requests(runs[n].metrics) == 120
        assert runs[n].offered_rate == pytest.approx(runs[0].offered_rate)
    assert replay_seconds(runs[400].metrics) > 3.5 * replay_seconds(runs[0].metrics)
    with pytest.raises(ConfigError, match=r"test\.yaml:\d+: strategy\.min_level_requests"):
        config(strategy={"min_level_requests": -1})


@pytest.mark.config_field("strategy.min_level_s")
def test_a_short_sample_at_a_high_load_is_judged_over_a_sustained_level() -> None:
    """60 requests at 4 req/s last 15 s at 1x and 1.9 s at 8x: a burst the simulated A100
    queues and still serves within the 3-s TTFT SLO, so without a minimum the short sample's
    capacity is about twice what the server sustains. Looped to 30 s a level, it lands where
    a sample long enough to need no loop (600 requests) lands."""

    def capacity(n: int, min_s: float) -> float:
        cfg, _ = config(
            workload={"num_prompts": n, "rate": 4},
            strategy={
                "capacity_high": 16,
                "capacity_levels": 24,
                "min_level_s": min_s,
                "min_level_requests": 0,  # the duration alone
            },
        )
        m = asyncio.run(measure_config(cfg, {}, study_protocol(cfg)))
        assert m.capacity_rps is not None
        return m.capacity_rps

    burst, sustained, long = capacity(60, 0.0), capacity(60, 30.0), capacity(600, 0.0)
    assert burst > 1.5 * sustained
    assert math.isclose(sustained, long, rel_tol=0.1), (sustained, long)
    with pytest.raises(ConfigError, match=r"test\.yaml:\d+: strategy\.min_level_s"):
        config(strategy={"min_level_s": -1})
