"""The validation phase's pure part (autotune/tuning/measure/interval.py): Student-t quantiles, the
paired interval and its variance floor, its coverage, the per-mode figures, the worst SLO
margin, and the verdict (best lower bound, "keep", SLOs in every repeat, pooled over-length)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.loadgen.level import LevelMetrics
from autotune.tuning.measure.interval import (
    Run,
    ValidationSummary,
    figure_of,
    paired_interval,
    summarize,
    t_quantile,
    t_two_sided,
)
from autotune.tuning.measure.scoring import Slo, worst_slo_margin


@pytest.mark.parametrize(
    ("confidence", "df", "table"),
    [
        (0.95, 1, 12.7062),
        (0.95, 2, 4.3027),
        (0.95, 4, 2.7764),
        (0.95, 9, 2.2622),
        (0.95, 29, 2.0452),
        (0.90, 5, 2.0150),
        (0.99, 3, 5.8409),
    ],
)
def test_t_quantiles_match_the_table(confidence: float, df: int, table: float) -> None:
    assert t_quantile(confidence, df) == pytest.approx(table, abs=5e-5)
    assert t_two_sided(t_quantile(confidence, df), df) == pytest.approx(confidence, abs=1e-10)


def test_t_quantile_rejects_what_has_no_answer() -> None:
    with pytest.raises(ValueError, match="confidence"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_two_sided(1.0, 0)


def test_identical_paired_gains_still_get_an_interval_of_the_floors_width() -> None:
    # capacities on a 1 % lattice: three repeats can land on exactly the same gain
    iv = paired_interval([3.0, 3.0, 3.0], 0.95, sd_floor=1.0)
    assert iv.sd == 0.0 and iv.sd_used == 1.0
    half = 4.302653 / math.sqrt(3)
    assert (iv.low, iv.high) == pytest.approx((3.0 - half, 3.0 + half), abs=1e-5)
    assert iv.high - iv.low > 0
    # above the floor, the sample's own spread is used
    wide = paired_interval([1.0, 5.0, 3.0], 0.95, sd_floor=1.0)
    assert wide.sd_used == pytest.approx(2.0) and wide.high - wide.low > iv.high - iv.low
    with pytest.raises(ValueError, match="sd_floor"):
        paired_interval([1.0, 2.0], 0.95, sd_floor=0.0)


def test_one_pair_gives_no_interval() -> None:
    iv = paired_interval([4.0], 0.95, sd_floor=1.0)
    assert iv.n == 1 and iv.low == -math.inf and iv.high == math.inf
    assert iv.to_dict()["low"] is None and iv.to_dict()["high"] is None


@pytest.mark.parametrize("n", [3, 5])
def test_coverage_is_the_confidence_level(n: int) -> None:
    """Over many simulated validations with known noise, the 95 % interval contains the true
    mean gain about 95 % of the time (binomial sd over 4,000 draws: 0.34 pp)."""
    rng = np.random.default_rng(20261209)
    true_gain, sd, reps = 6.0, 3.0, 4000
    hits = sum(
        paired_interval(list(rng.normal(true_gain, sd, n)), 0.95, sd_floor=0.01).contains(true_gain)
        for _ in range(reps)
    )
    assert 100.0 * hits / reps == pytest.approx(95.0, abs=1.5)


def test_coverage_on_the_lattice_with_the_floor() -> None:
    """Capacities quantised to a 1 % lattice with small noise: paired gains often tie, and the
    floored interval still covers the mean paired gain at least 95 % of the time."""
    rng = np.random.default_rng(7)
    step = math.log1p(0.01)

    def on_lattice(x: np.ndarray) -> np.ndarray:
        return np.exp(np.floor(np.log(x) / step) * step)

    def gains(k: int) -> np.ndarray:
        base = on_lattice(1.0 * np.exp(rng.normal(0, 0.003, k)))
        cand = on_lattice(1.083 * np.exp(rng.normal(0, 0.003, k)))
        return 100.0 * (cand / base - 1.0)

    truth = float(np.mean(gains(200_000)))  # the quantity the interval estimates
    reps = 2000
    hits = sum(
        paired_interval(list(gains(3)), 0.95, sd_floor=1.0).contains(truth) for _ in range(reps)
    )
    assert 100.0 * hits / reps >= 95.0


def test_figures_per_mode() -> None:
    kw = {"capacity_scale": 1.5, "objective": 900.0, "worst_margin": 0.8}
    assert figure_of("slo-capacity", **kw) == 1.5
    assert figure_of("offline", **kw) == 900.0
    assert figure_of("fixed-rate", **kw) == pytest.approx(1.25)  # headroom: lower margin wins
    assert figure_of("slo-capacity", **(kw | {"capacity_scale": None})) is None
    assert figure_of("fixed-rate", **(kw | {"worst_margin": 0.0})) is None


def test_worst_slo_margin_is_the_largest_p99_over_its_slo() -> None:
    m = LevelMetrics(completed=10, failed=0, p99_ttft_ms=1500.0, p99_tpot_ms=40.0)
    assert worst_slo_margin(m, Slo(p99_ttft_ms=3000, p99_tpot_ms=50)) == pytest.approx(0.8)
    assert worst_slo_margin(m, Slo(p99_ttft_ms=1000)) == pytest.approx(1.5)  # only set SLOs
    assert worst_slo_margin(m, Slo()) is None
    unmeasured = LevelMetrics(completed=10, failed=0, p99_ttft_ms=None, p99_tpot_ms=40.0)
    assert worst_slo_margin(unmeasured, Slo(p99_ttft_ms=3000, p99_tpot_ms=50)) is None


def _runs(base: list[float], **cands: list[float | None]) -> list[Run]:
    """Runs of a complete plan: capacities per repeat (None: the SLOs did not hold)."""
    out = [Run(r, 0, True, True, x, 0.0, 100) for r, x in enumerate(base)]
    for name, xs in cands.items():
        number = int(name[1:])
        out += [Run(r, number, False, x is not None, x, 0.0, 100) for r, x in enumerate(xs)]
    return out


def _summary(runs: list[Run], **kw: float) -> ValidationSummary:
    args = {"confidence": 0.95, "sd_floor": 1.0, "max_overlength_rate": 0.01} | kw
    return summarize(
        runs,
        mode="slo-capacity",
        baseline_trial=0,
        repeats=3,
        runs_planned=len(runs),
        confidence=args["confidence"],
        sd_floor=args["sd_floor"],
        max_overlength_rate=args["max_overlength_rate"],
    )


def test_the_best_lower_bound_wins_not_the_best_mean() -> None:
    base = [1.0, 1.0, 1.0]
    # t1: the best mean (+10 %) but noisy; t2: +6 % every time
    s = _summary(_runs(base, t1=[1.24, 0.95, 1.11], t2=[1.06, 1.06, 1.06]))
    c1, c2 = s.candidate(1), s.candidate(2)
    assert c1.interval.mean > c2.interval.mean and c1.interval.low < c2.interval.low
    assert (s.verdict, s.chosen, s.best) == ("recommend", 2, 2)


def test_keep_when_no_lower_bound_is_above_zero() -> None:
    s = _summary(_runs([1.0, 1.02, 0.99], t1=[1.01, 1.01, 1.0], t2=[1.0, 1.03, 0.98]))
    assert (s.verdict, s.chosen) == ("keep", None)
    assert s.best in (1, 2)


def test_a_candidate_must_hold_its_slos_in_every_repeat() -> None:
    s = _summary(_runs([1.0, 1.0, 1.0], t1=[1.5, None, 1.5], t2=[1.05, 1.05, 1.05]))
    assert s.candidate(1).eligible is False
    assert (s.verdict, s.chosen) == ("recommend", 2)
    only_bad = _summary(_runs([1.0, 1.0, 1.0], t1=[1.5, None, 1.5]))
    assert (only_bad.verdict, only_bad.chosen) == ("keep", None)


def test_over_length_is_judged_over_all_repeats() -> None:
    runs = _runs([1.0, 1.0, 1.0], t1=[1.1, 1.1, 1.1], t2=[1.05, 1.05, 1.05])
    cut = {(1, 0): 0.012, (1, 1): 0.004, (1, 2): 0.005, (2, 0): 0.012, (2, 1): 0.011}
    runs = [
        Run(
            r.repeat,
            r.trial_number,
            r.baseline,
            r.slo_held,
            r.figure,
            cut.get((r.trial_number, r.repeat), 0.009 if r.trial_number == 2 else 0.0),
            100,
        )
        for r in runs
    ]
    s = _summary(runs)
    # t1: 1.2 % in one sample but 0.70 % over its 300 requests; t2: 1.07 % over all of them
    assert s.candidate(1).overlength_rate == pytest.approx(0.007)
    assert s.candidate(1).eligible and not s.candidate(2).eligible
    assert s.chosen == 1


def test_an_infeasible_baseline_leaves_no_gain_to_give() -> None:
    runs = [Run(r, 0, True, False, None, 0.0, 100) for r in range(3)]
    runs += [Run(r, 4, False, True, 1.2, 0.0, 100) for r in range(3)]
    runs += [Run(r, 5, False, True, 1.4, 0.0, 100) for r in range(3)]
    s = _summary(runs)
    assert (s.verdict, s.chosen, s.baseline_held) == ("no-baseline", 5, 0)
    assert s.candidate(5).interval is None


def test_no_verdict_until_every_run_is_done() -> None:
    runs = _runs([1.0, 1.0, 1.0], t1=[1.2, 1.2, 1.2])
    s = summarize(
        runs[:-1],
        mode="slo-capacity",
        baseline_trial=0,
        repeats=3,
        runs_planned=len(runs),
        confidence=0.95,
        sd_floor=1.0,
        max_overlength_rate=0.01,
    )
    assert not s.complete and s.verdict is None and s.chosen is None
