"""Noise-aware capacity (docs/tuning.md#1-the-capacity-lattice, "Noise"): when runs contradict
monotone feasibility, or when the plan asks to confirm, the search re-measures its two
boundary points to a majority (2 agreeing runs, at most 3), the bracket follows majorities,
and the result reports the spread. Scripted feasibility sequences first (pure), then a noisy
fake runner through ``measure()``, the trial's attributes and the stored trial's spread."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import pytest
from support.runners import ScriptedRunner, jittered_up_to
from support.studies import config

from autotune.store import TrialRecord
from autotune.tuning.measure.capacity import (
    MAX_RUNS,
    REMEASURE_RUNS,
    CapacitySearch,
    Lattice,
    Runs,
    spread_of,
)
from autotune.tuning.measure.findings import capacity_spread, trial_summary
from autotune.tuning.measure.level_plan import LevelPlan, measure
from autotune.tuning.measure.outcome import level_record
from autotune.tuning.measure.scoring import score_trial
from autotune.tuning.measure.trial import TrialOutcome
from autotune.workload.build import build_workload

# 20 .. 160 req/s in 2 % steps: 20.0, 20.4, 20.8, 21.2 are points 0..3 and 22.5 is point 6
ISSUE = Lattice(20.0, 160.0, 0.02)
LAT = Lattice(0.25, 16.0, 0.01)


def scripted(
    lat: Lattice,
    truth: Callable[[int], bool],
    script: Mapping[int, Sequence[bool]] | None = None,
    *,
    confirm: bool = False,
    cap: int = 64,
) -> tuple[CapacitySearch, list[int]]:
    """Run a search whose n-th run of point k returns ``script[k][n]`` (``truth(k)`` once the
    script of k is used up); returns the search and the points in the order it asked."""
    s = CapacitySearch(lat, cap, None, confirm=confirm)
    asked: list[int] = []
    while (k := s.next_index()) is not None:
        runs = (script or {}).get(k, ())
        n = asked.count(k)
        s.record(k, runs[n] if n < len(runs) else truth(k))
        asked.append(k)
    return s, asked


def test_issue_example_points_are_on_the_lattice() -> None:
    assert [round(ISSUE.scale(k), 1) for k in (0, 1, 2, 3, 6)] == [20.0, 20.4, 20.8, 21.2, 22.5]


def test_issue_example_a_lucky_run_is_outvoted_when_confirming() -> None:
    """20.0 and 20.4 hold, 20.8, 21.2 and 22.5 fail; 20.8 holds once by luck."""

    def truth(k: int) -> bool:
        return k <= 1

    lucky = {2: [True]}
    plain, asked = scripted(ISSUE, truth, lucky)
    # one pass sees no contradiction (every point it asks lies inside the open bracket): the
    # lucky point is the answer, measured once, as before
    assert asked == [ISSUE.top, ISSUE.top // 2, 26, 13, 6, 3, 1, 2]
    assert plain.result().index == 2 and plain.result().monotone

    s, asked = scripted(ISSUE, truth, lucky, confirm=True)
    r = s.result()
    # 20.8 again (fails), 21.2 again (fails: 2 agreeing runs), 20.8 a third time (fails:
    # 1 of 3), then the new capacity point 20.4 once more (holds: 2 of 2)
    assert asked[8:] == [2, 3, 2, 1]
    assert r.status == "found" and r.index == 1 and r.scale == pytest.approx(20.4)
    assert r.levels == 12 and not r.monotone
    assert r.spread is not None
    assert r.spread.at == Runs(2, 2) and r.spread.above == Runs(1, 3)
    assert (r.spread.band_low, r.spread.band_high) == pytest.approx((20.4, ISSUE.scale(2)))
    assert s.measured[2] is False and s.measured[1] is True


def test_a_contradiction_from_a_repeated_run_triggers_re_measurement_without_confirm() -> None:
    s, _ = scripted(ISSUE, lambda k: k <= 1, {2: [True]})
    assert s.next_index() is None
    s.record(2, False)  # the same point measured again (by a caller) fails: not monotone
    asked = []
    while (k := s.next_index()) is not None:
        s.record(k, k <= 1)
        asked.append(k)
    # 21.2 to a majority, 20.8's deciding run, then 20.4 with the last of the 4 re-runs
    assert asked == [3, 2, 1]
    r = s.result()
    assert r.index == 1 and r.spread is not None and r.spread.above == Runs(1, 3)


def test_an_unlucky_low_run_is_outvoted_and_the_search_goes_on_above_it() -> None:
    def truth(k: int) -> bool:
        return k <= 300

    unlucky = {299: [False]}
    plain, _ = scripted(LAT, truth, unlucky)
    assert plain.result().index == 298  # one pass: too low, and nothing says so
    s, asked = scripted(LAT, truth, unlucky, confirm=True)
    r = s.result()
    assert r.status == "found" and r.index == 300 and r.converged
    # 298 confirmed, 299 held twice more (2 of 3): the bracket moves up to 299 .. 312 and
    # bisects (305, 302, 300, 301); the last re-run confirms 300, and 301 keeps its one run
    assert asked[10:] == [298, 299, 299, 305, 302, 300, 301, 300]
    assert s.runs[299] == [False, True, True] and s.runs[301] == [False]
    assert sum(len(v) - 1 for v in s.runs.values()) == REMEASURE_RUNS
    assert r.spread is not None and not r.spread.monotone
    assert r.spread.at == Runs(2, 2) and r.spread.above == Runs(0, 1)
    band = (r.spread.band_low, r.spread.band_high)
    assert band == pytest.approx((LAT.scale(299), LAT.scale(301)))


@pytest.mark.parametrize("cap", [0.2, 0.9, 1.7, 5.0, 16.5])
def test_monotone_runs_measure_the_same_points_as_before(cap: float) -> None:
    def truth(k: int) -> bool:
        return LAT.scale(k) <= cap

    s, asked = scripted(LAT, truth)
    r = s.result()
    # each point once, in the documented order, and the spread is the one step it found
    assert len(asked) == len(set(asked)) == r.levels and r.monotone
    assert asked[0] == LAT.top and (len(asked) == 1 or asked[1] == LAT.top // 2)
    if cap == 0.9:  # the order the bisection takes (docs/tuning.md#1-the-capacity-lattice)
        assert asked == [417, 208, 104, 156, 130, 117, 123, 126, 128, 129]
    confirmed, asked2 = scripted(LAT, truth, confirm=True)
    c = confirmed.result()
    assert asked2[: len(asked)] == asked and (c.index, c.status) == (r.index, r.status)
    if r.status == "found":
        assert r.spread is not None and r.spread.at == Runs(1, 1)
        assert r.spread.above == Runs(0, 1)
        assert r.index is not None and r.spread.band_low == pytest.approx(LAT.scale(r.index))
        assert r.spread.band_high == pytest.approx(LAT.scale(r.index + 1))
        # confirming a monotone bracket costs 2 levels: one agreeing run of each point
        assert asked2[len(asked) :] == [r.index, r.index + 1] and c.spread is not None
        assert c.spread.at == Runs(2, 2) and c.spread.above == Runs(0, 2) and c.monotone
    elif r.status == "at_top":
        assert asked2[len(asked) :] == [LAT.top]
    else:
        assert r.status == "below_low" and asked2[len(asked) :] == [0]


def test_no_point_runs_more_than_three_times_nor_the_search_more_than_four_re_runs() -> None:
    flip = {300: [True, False, True, False, True], 301: [False, True, False, True]}
    s, asked = scripted(LAT, lambda k: k <= 300, flip, confirm=True)
    r = s.result()
    assert max(len(v) for v in s.runs.values()) == MAX_RUNS
    assert s.runs[300] == [True, False, True] and s.runs[301] == [False, True, False]
    assert asked[-4:] == [300, 301, 300, 301]  # interleaved: fewest runs first, lower first
    assert r.index == 300 and r.spread is not None and not r.spread.monotone
    assert r.spread.at == Runs(2, 3) and r.spread.above == Runs(1, 3)
    # every point keeps flipping: re-runs stop at 4 whatever else is open
    always = {k: [bool(i % 2) ^ (k <= 300) for i in range(9)] for k in range(LAT.top + 1)}
    s2, _ = scripted(LAT, lambda k: k <= 300, always, confirm=True)
    assert sum(len(v) - 1 for v in s2.runs.values()) <= REMEASURE_RUNS
    assert max(len(v) for v in s2.runs.values()) <= MAX_RUNS


def test_the_level_cap_counts_re_runs() -> None:
    s, asked = scripted(LAT, lambda k: k <= 300, {300: [True, False]}, confirm=True, cap=11)
    assert len(asked) == 11 == s.result().levels


def test_spread_of_monotone_and_flipped_runs() -> None:
    mono = spread_of(LAT, {10: [True], 11: [False], 40: [False]}, 10)
    assert mono.monotone and mono.text() == (
        f"held 1/1, next point up 0/1; uncertain between x{LAT.scale(10):.3f} and "
        f"x{LAT.scale(11):.3f}"
    )
    noisy = spread_of(LAT, {8: [True, False, True], 10: [True], 11: [False, True, False]}, 10)
    assert not noisy.monotone
    assert (noisy.band_low, noisy.band_high) == pytest.approx((LAT.scale(8), LAT.scale(11)))
    low = spread_of(LAT, {0: [False, True, False]}, None)  # nothing feasible by majority
    assert low.at is None and low.above == Runs(1, 3) and not low.monotone


# -- a noisy runner through measure() -------------------------------------------------------
def test_a_noisy_runner_reports_the_majority_boundary_and_its_spread() -> None:
    cfg, _ = config(strategy={"capacity_levels": 24})
    wl = build_workload(cfg.workload)
    plan = dataclasses.replace(LevelPlan.of(cfg), lattice=LAT, early_stop=None, lean=0.5)
    runner = ScriptedRunner(levels=jittered_up_to(1.0, seed=11))
    plain = asyncio.run(measure(runner, wl, plan))
    assert plain.capacity is not None and plain.capacity.monotone  # one pass sees no noise
    runner = ScriptedRunner(levels=jittered_up_to(1.0, seed=11))
    confirm = dataclasses.replace(plan, confirm_capacity=True)
    m = asyncio.run(measure(runner, wl, confirm))
    cap = m.capacity
    assert cap is not None and cap.status == "found" and cap.index is not None
    runs: dict[int, list[bool]] = {}
    for lv in m.levels:
        runs.setdefault(LAT.index(lv.score.scale), []).append(lv.score.feasible)
    held = {k: 2 * sum(v) > len(v) for k, v in runs.items()}
    # the capacity is a majority boundary: held by majority, its next point up failed by one
    assert held[cap.index] and not held[cap.index + 1]
    assert len(runs[cap.index]) >= 2 and len(runs[cap.index + 1]) >= 2
    assert not cap.monotone and cap.spread is not None
    assert cap.spread.at == Runs(sum(runs[cap.index]), len(runs[cap.index]))
    assert cap.levels == len(m.levels) == sum(1 for call, _ in runner.calls if call == "level")
    # the plain pass's capacity and the majority boundary differ on this seed
    assert plain.capacity.index != cap.index

    # the trial's attributes and the stored trial say the same
    rec = TrialRecord("t", 0, "baseline", "COMPLETE", {}, {}, None, None, "sim-virtual")
    rec.levels = [level_record(lv.index, lv.outcome, lv.score) for lv in m.levels]
    score = score_trial(m.scores, cap)
    rec.feasible, rec.capacity_scale = score.feasible, score.capacity_scale
    assert capacity_spread(rec, LAT) == cap.spread
    assert rec.headline_level() is not None
    assert rec.headline_level().scale == pytest.approx(cap.scale)  # type: ignore[union-attr]
    attrs = trial_summary(TrialOutcome(score, rec, None), cfg).attrs()
    assert cap.spread.above is not None
    assert attrs["capacity_held"] == cap.spread.at.text()
    assert attrs["capacity_above_held"] == cap.spread.above.text()
    assert attrs["capacity_monotone"] is False
    assert attrs["capacity_band_low"] <= cap.scale < attrs["capacity_band_high"]


@pytest.mark.parametrize(
    ("kind", "confirm"), [("vllm", True), ("sim", False), ("sim-virtual", False)]
)
def test_a_real_worker_confirms_every_capacity_and_the_simulators_do_not(
    kind: str, confirm: bool
) -> None:
    # a real server's boundary runs differ from run to run; a simulator would replay the
    # same numbers (docs/tuning.md#1-the-capacity-lattice, "Noise")
    cfg, _ = config(worker={"kind": kind})
    assert LevelPlan.of(cfg).confirm_capacity is confirm
