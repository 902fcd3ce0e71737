"""Calibration's fit: the robust least squares on tiny problems, the probe figures, and the
twin fit recovering constants a simulator run with noise was made with
(docs/calibrate.md#3-the-fit)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from autotune.calibrate import Observation, Probe, Timing, default_suite, fit_twin, observe
from autotune.calibrate.observe import EngineSums, engine_sums_of_sim, flushed, trimmed_mean
from autotune.calibrate.robust import robust_fit
from autotune.calibrate.twin_fit import predict, stream_bound
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import (
    EngineArgs,
    Measured,
    RequestTiming,
    TwinFile,
    dump_twin,
    load_twin,
    twin_constants,
    twin_hardware,
    twin_mismatch,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WIDE = np.array([10.0, 10.0])


def test_robust_fit_solves_a_line_and_states_its_standard_errors() -> None:
    rng = np.random.default_rng(3)
    t = np.linspace(0, 1, 200)
    y = 2.0 + 0.5 * t + rng.normal(0, 0.01, t.size)
    fit = robust_fit(
        lambda p: p[0] + p[1] * t - y,
        np.zeros(2),
        prior_mean=np.zeros(2),
        prior_sigma=WIDE,
        noise=0.01,
        noise_floor=1e-4,
    )
    assert fit.x == pytest.approx([2.0, 0.5], abs=0.01)
    # ordinary least squares' standard errors for the same data
    a = np.column_stack([np.ones_like(t), t])
    s2 = np.sum((a @ fit.x - y) ** 2) / (t.size - 2)
    ols = np.sqrt(np.diag(np.linalg.inv(a.T @ a) * s2))
    assert fit.stderr == pytest.approx(ols, rel=0.1)
    assert fit.noise == pytest.approx(0.01, rel=0.2)


def test_soft_l1_resists_an_outlier_that_drags_plain_least_squares() -> None:
    t = np.linspace(0, 1, 40)
    y = 1.0 + t
    y[5] += 5.0  # one wild measurement
    robust = robust_fit(
        lambda p: p[0] + p[1] * t - y,
        np.zeros(2),
        prior_mean=np.zeros(2),
        prior_sigma=WIDE,
        noise=0.01,
    )
    plain = np.linalg.lstsq(np.column_stack([np.ones_like(t), t]), y, rcond=None)[0]
    assert abs(plain[0] - 1.0) > 0.1  # least squares is dragged
    assert robust.x == pytest.approx([1.0, 1.0], abs=0.02)


def test_the_prior_holds_a_constant_the_data_cannot_see() -> None:
    t = np.linspace(0, 1, 20)
    fit = robust_fit(
        lambda p: (p[0] + 0 * p[1]) - 3.0 + 0 * t,  # p[1] moves nothing
        np.zeros(2),
        prior_mean=np.array([0.0, 1.5]),
        prior_sigma=np.array([5.0, 0.7]),
    )
    assert fit.x[0] == pytest.approx(3.0, abs=0.01)
    assert fit.x[1] == pytest.approx(1.5, abs=0.01)
    assert fit.stderr[1] == pytest.approx(0.7, rel=0.01)  # the prior's width: not pinned


def test_a_time_limited_fit_keeps_its_errors_inside_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limit covers the errors (four evaluations per parameter) and a later call's
    reserve, not only the iterations: a fake CPU clock that every evaluation advances by 1 s
    counts what the fit spent."""
    clock = [0.0]
    monkeypatch.setattr("autotune.calibrate.robust.time.thread_time", lambda: clock[0])

    def residual(p: np.ndarray) -> np.ndarray:  # Rosenbrock's valley: many small steps
        clock[0] += 1.0
        return np.array([10.0 * (p[1] - p[0] ** 2), 1.0 - p[0]])

    kw: dict[str, Any] = {
        "prior_mean": np.zeros(2),
        "prior_sigma": np.full(2, 100.0),
        "max_iter": 200,
        "tol": 1e-12,
    }
    start = np.array([-1.2, 1.0])
    robust_fit(residual, start, **kw)
    unlimited = clock[0]
    for limit in (15.0, 30.0):
        clock[0] = 0.0
        fit = robust_fit(residual, start, time_limit_s=limit, **kw)
        assert clock[0] <= limit and np.isfinite(fit.stderr).all(), (limit, clock[0])
        clock[0] = 0.0
        robust_fit(residual, start, time_limit_s=limit, errors=False, reserve_evals=8, **kw)
        assert clock[0] <= limit - 8, (limit, clock[0])
    assert unlimited > 40.0, unlimited  # the limits cut the same fit short


def test_observe_reduces_each_probe_to_its_figures() -> None:
    burst = Probe("burst", 32, 4, requests=8)
    ts = [Timing(0.01 * (i + 1), (0.002, 0.002, 0.002)) for i in range(8)]
    obs = {o.metric: o.value for o in observe(burst, ts)}
    # no gaps for a burst; its slowest quarter's mean TTFT is the API server's queue
    assert set(obs) == {"ttft", "ttft_last"}
    assert obs["ttft_last"] == pytest.approx((0.07 + 0.08) / 2)
    dec = Probe("decode", 16, 4, requests=2)
    got = {o.metric: o.value for o in observe(dec, [Timing(0.1, (0.01, 0.02, 0.9))] * 2)}
    assert got["itl"] == pytest.approx(np.mean([0.01, 0.02, 0.9] * 2))
    assert trimmed_mean([1.0] * 9 + [100.0]) == 1.0  # the stray pause is cut
    assert observe(dec, []) == []


def test_a_flushed_stream_is_left_out_of_the_figures() -> None:
    """A request whose tokens arrived together timed its API server's starvation, not the
    engine (docs/calibrate.md#2-the-probe-suite)."""
    dec = Probe("decode", 16, 8, requests=3)
    streamed = Timing(0.02, (0.003,) * 7)
    at_once = Timing(0.2, (0.0,) * 6 + (0.003,))
    assert flushed(at_once) and not flushed(streamed)
    got = {o.metric: o.value for o in observe(dec, [streamed, streamed, at_once])}
    assert got == pytest.approx({"ttft": 0.02, "itl": 0.003})
    # every request flushed: the probe measured nothing of the engine
    assert observe(dec, [at_once, at_once]) == []
    # a burst's few tokens say nothing about streaming
    assert not flushed(Timing(0.1, (0.0, 0.0, 0.0)))


def test_the_engine_cores_own_figures_survive_a_flush() -> None:
    """The server's histograms time the engine core's steps, which a starved API server's
    flush does not reach: they stay when every stream was flushed
    (docs/calibrate.md#2-the-probe-suite)."""
    dec = Probe("decode", 16, 8, requests=2)
    at_once = Timing(0.2, (0.0,) * 6 + (0.003,))
    engine = EngineSums(itl_sum=0.042, itl_count=14, prefill_sum=0.01, prefill_count=2)
    got = {o.metric: o.value for o in observe(dec, [at_once, at_once], engine)}
    assert got == pytest.approx({"engine_itl": 0.003, "engine_prefill": 0.005})
    # nothing counted, no figure: a server without the histograms
    assert observe(dec, [at_once], EngineSums()) == []


def test_the_twins_engine_figures_are_its_step_ends_not_its_deliveries() -> None:
    """engine_sums_of_sim adds up what a simulated server's histograms would: prefill from
    scheduling to the first token's step end, and one gap per later token, between the
    engine core's step ends, however late the API server delivered them."""

    def timing(scheduled: float, core: list[float], late: float) -> RequestTiming:
        times = np.array(core)
        return RequestTiming(
            "r",
            16,
            len(core),
            0.0,
            scheduled,
            times[0] + late,
            times[-1] + late,
            times + late,
            engine_token_times=times,
        )

    sums = engine_sums_of_sim([timing(0.0, [0.01, 0.013, 0.016], 0.5), timing(0.02, [0.03], 0.1)])
    assert (sums.itl_count, sums.prefill_count) == (2, 2)
    assert sums.itl_sum == pytest.approx(0.006)
    assert sums.prefill_sum == pytest.approx(0.01 + 0.01)


def test_default_suite_stays_inside_the_servers_limits() -> None:
    suite = default_suite(1024, max_num_seqs=8, max_num_batched_tokens=512)
    assert {p.kind for p in suite} == {"decode", "prefill", "concurrency", "burst"}
    for p in suite:
        assert p.prompt_len + p.output_len <= 1024
        assert p.concurrency <= 8
        if p.kind == "prefill":
            assert p.prompt_len <= 512
    assert len({p.name for p in suite}) == len(suite)
    with pytest.raises(ValueError, match="no room"):
        default_suite(40)


TRUTH = TwinFile(
    autotune_twin=1,
    base="H100-80GB",
    hardware={"eta_bw": 0.6},
    cost={"t_fixed": 1.5e-3},
    front_end={"per_request": 2e-3, "per_output_token": 80e-6},
)


def test_the_fit_recovers_known_constants_within_their_stated_uncertainty() -> None:
    """A simulator run with known constants, 3 % noise on every figure: each fitted
    constant lies within 3 standard errors of the truth, the well-pinned intake within
    10 %, and the fitted twin predicts a load it never saw within 5 %, where the base
    profile misses its inter-token gap by more than 10 %."""
    model, base = get_model(MODEL), get_hardware("H100-80GB")
    args = EngineArgs(max_model_len=4096)
    suite = default_suite(4096, 256, 8192)
    true_hw = twin_hardware(TRUTH, "truth")
    rng = np.random.default_rng(1)
    measured = [
        Observation(o.probe, o.metric, o.value * math.exp(rng.normal(0, 0.03)))
        for o in predict(suite, model, true_hw, args)
    ]
    cal = fit_twin(suite, measured, model, base, args)
    truth = twin_constants(true_hw)
    for key, v in cal.values.items():
        assert abs(v - truth[key]) <= 3 * cal.stderr[key], (key, v, truth[key], cal.stderr[key])
    per_request = ("front_end", "per_request")
    assert cal.values[per_request] == pytest.approx(2e-3, rel=0.1)
    assert max(cal.residual_pct.values()) < 10
    # a held-out load: 48 in flight, longer prompts than any probe's
    unseen = [Probe("concurrency", 1500, 128, requests=96, concurrency=48)]
    fitted = twin_hardware(cal.spec(), "fitted")
    want = {o.metric: o.value for o in predict(unseen, model, true_hw, args)}
    got = {o.metric: o.value for o in predict(unseen, model, fitted, args)}
    untuned = {o.metric: o.value for o in predict(unseen, model, base, args)}
    for metric in ("itl", "ttft"):
        assert got[metric] == pytest.approx(want[metric], rel=0.05)
    # the base profile's step is more than 10 % short (its TTFT is right by luck: queueing)
    assert untuned["itl"] < 0.9 * want["itl"]


def test_the_api_servers_cost_per_streamed_token_is_capped_by_what_a_loop_streamed() -> None:
    """A fit never leaves the API server slower at streaming than a closed loop showed it
    to be: 16 streams at a mean gap of 4 ms put at most 250 us into each token. A fit
    above it capped every config of 16 or more sequences below what vLLM served
    (docs/calibrate.md#3-the-fit)."""
    model, base = get_model(MODEL), get_hardware("H100-80GB")
    args = EngineArgs(max_model_len=2048)
    loops = [Probe("concurrency", 64, 16, requests=2 * n, concurrency=n) for n in (4, 16)]
    suite = [Probe("decode", 64, 16, requests=2), *loops]
    measured = predict(suite, model, twin_hardware(TRUTH, "truth"), args)
    gaps = {o.probe: o.value for o in measured if o.metric == "itl"}
    assert stream_bound(suite, measured) == pytest.approx(
        min(gaps[p.name] / p.concurrency for p in loops)
    )
    assert stream_bound(suite[:1], measured) is None  # no loop of several: no bound
    # a start far above the bound, left where it is (no iteration): the cap applies
    slow = TwinFile(autotune_twin=1, base=base.name, front_end={"per_output_token": 0.05})
    cal = fit_twin(suite, measured, model, base, args, max_iter=0, starts=1, start=slow)
    cap = stream_bound(suite, measured)
    assert cal.values[("front_end", "per_output_token")] == cap
    assert cal.spec().front_end["per_output_token"] == cap
    # below the bound, a fitted cost stands
    quick = TwinFile(autotune_twin=1, base=base.name, front_end={"per_output_token": 1e-6})
    cal = fit_twin(suite, measured, model, base, args, max_iter=0, starts=1, start=quick)
    assert cal.values[("front_end", "per_output_token")] == pytest.approx(1e-6)


def test_a_fitted_profile_round_trips(tmp_path: object) -> None:
    model, base = get_model(MODEL), get_hardware("H100-80GB")
    args = EngineArgs(max_model_len=2048)
    suite = [Probe("decode", 64, 16, requests=2), Probe("prefill", 512, 1, requests=2)]
    measured = predict(suite, model, twin_hardware(TRUTH, "truth"), args)
    cal = fit_twin(suite, measured, model, base, args, max_iter=3, starts=1)
    spec = cal.spec({"vllm": "0.32.0", "model": MODEL, "host": "gpu-7", "when": "2026-12-04"})
    path = tmp_path / "twin.yaml"  # type: ignore[operator]
    path.write_text(dump_twin(spec))
    back = load_twin(f"file:{path}")
    assert back.spec == spec
    consts = twin_constants(back.hardware)
    for key, v in cal.values.items():
        assert consts[key] == pytest.approx(v)
    assert set(spec.uncertainty) == {name for _, name in cal.values}
    assert back.spec.measured.host == "gpu-7"


def test_mismatch_names_each_known_difference() -> None:
    m = Measured(vllm="0.32.0", model="a", host="gpu-7")
    assert twin_mismatch(m, vllm="0.32.0", model="a", host="gpu-7") == []
    assert twin_mismatch(m, vllm="0.31.1", model="b", host=None) == [
        "vLLM 0.31.1 here, 0.32.0 fitted",
        "model b here, a fitted",
    ]
    assert twin_mismatch(Measured(), vllm="0.31.1", model="b", host="x") == []
