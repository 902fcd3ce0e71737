"""A study whose capacity lies below the lowest load it tried: the advice to lower
``strategy.capacity_low`` and the value it names (autotune/report/lowload.py), on tiny
stored records."""

from __future__ import annotations

from typing import Any

from autotune.report.lowload import LowLoad, below_lowest_load, lower_capacity_low_hint
from autotune.store import LevelRecord, TrialRecord


def _level(scale: float, served: float, *, feasible: bool = False, **kw: Any) -> LevelRecord:
    return LevelRecord(
        level_index=0,
        scale=scale,
        offered_rate=4.0 * scale,
        achieved_rate=served,
        completed=10,
        failed=0,
        over_length=0,
        error_rate=0.0,
        p99_ttft_ms=9000.0,
        p99_tpot_ms=30.0,
        p99_itl_ms=30.0,
        output_throughput=100.0,
        request_throughput=served,
        goodput=None,
        feasible=feasible,
        metrics=kw.pop("metrics", {}),
        violations=kw.pop("violations", [{"name": "p99_ttft", "text": "p99 TTFT"}]),
    )


def _trial(n: int, *levels: LevelRecord) -> TrialRecord:
    return TrialRecord(
        study_name="t",
        optuna_trial_number=n,
        stage="baseline",
        state="COMPLETE",
        params={},
        engine_args={},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
        feasible=any(lv.feasible for lv in levels),
        levels=list(levels),
    )


def test_saturated_lowest_level_names_half_the_served_share() -> None:
    # at x0.25 (1 req/s offered) the better trial completed 0.4 req/s: its SLO-meeting load
    # lies below x0.1; half of that, x0.05, is the advice
    trials = [_trial(0, _level(0.25, 0.2), _level(1.0, 0.3)), _trial(1, _level(0.25, 0.4))]
    low = below_lowest_load(trials, "slo-capacity")
    assert low == LowLoad(1, 0.25, 1.0, 0.4)
    assert low.suggested_low() == 0.05
    hint = lower_capacity_low_hint(low)
    assert "lower strategy.capacity_low to 0.05 or less" in hint
    assert "trial 1 completed 0.40 req/s (40% of it)" in hint


def test_no_advice_when_a_lower_load_cannot_help_or_is_not_needed() -> None:
    saturated = _trial(0, _level(0.25, 0.4))
    too_long = _trial(1, _level(0.25, 1.0, violations=[{"name": "overlength_rate"}]))
    feasible = _trial(2, _level(0.25, 1.0, feasible=True), _level(0.5, 1.0))
    assert below_lowest_load([saturated, too_long], "slo-capacity") is None
    assert below_lowest_load([saturated, feasible], "slo-capacity") is None
    assert below_lowest_load([saturated], "fixed-rate") is None  # no lattice to lower


def test_a_level_stopped_early_gives_two_halvings_and_says_why() -> None:
    stopped = _level(0.25, 0.1, metrics={"early_stop": {"reason": "p99_ttft"}})
    low = below_lowest_load([_trial(0, stopped)], "slo-capacity")
    assert low is not None and low.served_share is None
    assert low.suggested_low() == 0.062
    assert "does not say how far below" in lower_capacity_low_hint(low)
