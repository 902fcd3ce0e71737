"""Arrival processes: Poisson, gamma burstiness, vLLM's rescale, constant, ramp, traces."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autotune.errors import ConfigError
from autotune.sim import sim_requests
from autotune.workload import arrivals, random_workload


def test_poisson_mean_gap_is_one_over_rate() -> None:
    t = arrivals.poisson(20000, 8.0, seed=1, rescale=False)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness: float) -> None:
    t = arrivals.gamma(20000, 5.0, burstiness, seed=2)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=1e-9)  # rescaled: exactly the rate


def test_vllm_rescale_puts_the_last_arrival_at_n_over_rate() -> None:
    raw = arrivals.gamma(500, 4.0, 0.5, seed=7, rescale=False)
    scaled = arrivals.gamma(500, 4.0, 0.5, seed=7)
    assert scaled[-1] == 500 / 4.0
    assert raw[-1] != pytest.approx(500 / 4.0, rel=1e-6)  # the gap vLLM closes
    ratio = scaled / raw  # one factor for the whole schedule: gaps keep their shape
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    assert scaled[0] > 0  # first request after the first gap, as in vLLM


def test_gamma_draws_match_vllms_per_request_loop() -> None:
    """vLLM seeds numpy's global RNG and draws one gamma per request; same numbers here."""
    n, rate, b, seed = 50, 3.0, 2.0, 11
    legacy = np.random.RandomState(seed)
    delays = np.cumsum([legacy.gamma(shape=b, scale=1.0 / (rate * b)) for _ in range(n)])
    delays *= (n / rate) / delays[-1]
    np.testing.assert_allclose(arrivals.gamma(n, rate, b, seed=seed), delays, rtol=1e-12)


def test_constant_and_infinite_burstiness() -> None:
    t = arrivals.constant(10, 4.0)
    np.testing.assert_allclose(np.diff(t), 0.25)
    assert t[0] == 0.25 and t[-1] == 2.5
    np.testing.assert_allclose(arrivals.gamma(10, 4.0, math.inf), t)
    assert list(arrivals.all_at_once(3)) == [0.0, 0.0, 0.0]


def test_linear_ramp_rates_rise_monotonically() -> None:
    t = arrivals.ramp(101, 1.0, 11.0, burstiness=math.inf)
    rates = 1.0 / np.diff(np.concatenate([[0.0], t]))
    np.testing.assert_allclose(rates, np.linspace(1.0, 11.0, 101))
    assert np.all(np.diff(rates) > 0)
    noisy = arrivals.ramp(4000, 2.0, 50.0, seed=3)  # vLLM's default burstiness 1
    quarters = np.array_split(np.diff(np.concatenate([[0.0], noisy])), 4)
    mean_rates = [1.0 / q.mean() for q in quarters]
    assert all(a < b for a, b in itertools.pairwise(mean_rates))
    down = arrivals.ramp(50, 10.0, 1.0, burstiness=math.inf)
    assert np.all(np.diff(np.diff(down)) > 0)  # falling rate: widening gaps


def test_exponential_ramp_is_geometric() -> None:
    t = arrivals.ramp(3, 1.0, 4.0, burstiness=math.inf, strategy="exponential")
    np.testing.assert_allclose(np.diff(np.concatenate([[0.0], t])), [1.0, 0.5, 0.25])


def test_trace_rate_scaling_halves_gaps_at_2x() -> None:
    ts = [10.0, 10.0, 11.0, 14.0, 20.0]
    base = arrivals.scale_trace(ts)
    np.testing.assert_allclose(base, [0.0, 0.0, 1.0, 4.0, 10.0])
    np.testing.assert_allclose(np.diff(arrivals.scale_trace(ts, rate_scale=2.0)), np.diff(base) / 2)
    np.testing.assert_allclose(arrivals.scale_trace(ts, time_scale=2.0), base * 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: arrivals.poisson(10, 0.0),
        lambda: arrivals.poisson(10, -1.0),
        lambda: arrivals.gamma(10, math.nan, 1.0),
        lambda: arrivals.gamma(10, 1.0, 0.0),
        lambda: arrivals.constant(10, 0.0),
        lambda: arrivals.constant(10, math.inf),
        lambda: arrivals.ramp(10, 0.0, 5.0),
        lambda: arrivals.ramp(10, 1.0, -5.0),
        lambda: arrivals.scale_trace([0.0, 1.0], rate_scale=0.0),
        lambda: arrivals.scale_trace([0.0, 1.0], time_scale=-2.0),
        lambda: arrivals.scale_trace([1.0, 0.5]),
        lambda: arrivals.poisson(-1, 1.0),
    ],
    ids=[
        "poisson-0",
        "poisson-neg",
        "gamma-nan",
        "burstiness-0",
        "constant-0",
        "constant-inf",
        "ramp-start-0",
        "ramp-end-neg",
        "rate-scale-0",
        "time-scale-neg",
        "unsorted",
        "n-neg",
    ],
)
def test_non_positive_rates_are_config_errors(call: object) -> None:
    with pytest.raises(ConfigError, match="arrivals: "):
        call()  # type: ignore[operator]


def test_workload_schedules_and_closed_loop() -> None:
    w = random_workload(10, input_len=8, output_len=4)
    timed = w.with_arrivals(arrivals.poisson(10, 2.0), note="poisson 2/s")
    assert timed.profile().mean_rate == pytest.approx(2.0)
    assert "poisson 2/s" in timed.source
    closed = w.closed_loop(4)
    assert closed.arrivals() is None and closed.closed_loop_concurrency == 4
    assert all(r.arrival is None for r in closed.requests)
    assert all(s.arrival == 0.0 for s in sim_requests(closed))
    prof = closed.profile()
    assert prof.closed_loop and prof.peak_concurrency == 4 and prof.mean_rate is None
    with pytest.raises(ConfigError, match="concurrency"):
        w.closed_loop(0)
    with pytest.raises(ConfigError, match="3 times for 10 requests"):
        w.with_arrivals([0.0, 1.0, 2.0])
    with pytest.raises(ConfigError, match="non-decreasing"):
        w.with_arrivals(list(range(10, 0, -1)))
