"""Settling losing trials at the best capacity so far (docs/tuning.md#14-settling-losing-trials):
the search's settle point, a near miss measured again, a study whose settled trials are
Optuna's PRUNED with their bound shown, the same recommendation for fewer replayed seconds,
and the bar each trial is settled at."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.runners import SIM_VOCAB, sim_http_runner
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.store import Store
from autotune.tuning import attrs
from autotune.tuning.measure.capacity import LEAN, ROOM_CAP, CapacitySearch, Lattice
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.level_plan import LevelPlan, SettleBar, measure
from autotune.tuning.measure.scoring import LevelScore, score_level
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.settling import settle_bar, tpe_good_group
from autotune.workload.build import build_workload

LAT = Lattice(0.25, 4.0, 0.01)


def _run(search: CapacitySearch, capacity: int, near: set[int] | None = None) -> list[int]:
    """Drive ``search`` against a server whose capacity is lattice point ``capacity``;
    ``near``: points whose (first) failure is a near miss."""
    asked = []
    while (k := search.next_index()) is not None:
        asked.append(k)
        search.record(k, k <= capacity, near=k in (near or set()))
    return asked


def test_a_config_that_fails_the_settle_point_is_settled_after_one_level() -> None:
    s = CapacitySearch(LAT, settle=200)
    assert _run(s, capacity=150) == [200]
    r = s.result()
    assert r.status == "settled" and r.levels == 1 and r.scale is None
    assert r.below == pytest.approx(LAT.scale(200))


def test_a_tie_costs_two_levels_and_a_better_config_is_searched_upwards_only() -> None:
    tie = CapacitySearch(LAT, settle=200)
    assert _run(tie, capacity=200) == [200, 201]
    assert tie.result().status == "found" and tie.result().index == 200
    better = CapacitySearch(LAT, settle=200)
    asked = _run(better, capacity=230)
    assert min(asked) == 200 and better.result().index == 230  # never below the bar
    plain = CapacitySearch(LAT)
    _run(plain, capacity=230)
    assert plain.result().index == 230  # the same answer as the search from the ends


def test_a_near_miss_is_measured_again_and_the_majority_decides() -> None:
    # a failure within the noise: run again; two failures settle it
    s = CapacitySearch(LAT, settle=200)
    assert _run(s, capacity=150, near={200}) == [200, 200]
    assert s.result().status == "settled" and s.result().levels == 2
    # held on the re-runs (the first run was the unlucky one): the search goes on upwards
    s = CapacitySearch(LAT, settle=200)
    assert s.next_index() == 200
    s.record(200, False, near=True)
    assert s.next_index() == 200
    s.record(200, True)
    assert s.next_index() == 200  # 1 of 2: a third run decides
    s.record(200, True)
    while (k := s.next_index()) is not None:
        s.record(k, k <= 205)
    assert s.result().status == "found" and s.result().index == 205


def test_a_near_miss_is_a_failure_within_the_noise_band() -> None:
    def score(miss: float) -> LevelScore:
        return LevelScore(2.0, {"p99_ttft": miss, "p99_tpot": -0.5}, miss <= 0, 1.0)

    bar = SettleBar(2.0, 3, band_pct=3.0)
    assert bar.near(score(0.02), LAT) and not bar.near(score(0.05), LAT)
    assert not bar.near(score(-0.1), LAT)  # held: no miss
    # no band measured yet: one lattice step stands in for it
    assert SettleBar(2.0, 3).near(score(0.005), LAT)
    assert not SettleBar(2.0, 3).near(score(0.02), LAT)


def test_a_new_best_climbs_by_half_the_points_its_headroom_spans() -> None:
    # held at the settle point with p99 at 80 % of its SLO: 1/0.8 spans 22.4 points of 1 %,
    # so the climb starts 11 points up; with no headroom figure, 1 point up as before
    assert LAT.steps(1.01**7) == pytest.approx(7.0)
    roomy = CapacitySearch(LAT, settle=200)
    assert roomy.next_index() == 200
    roomy.record(200, True, margin=0.8)
    assert roomy.next_index() == 211
    for margin in (None, 0.995, 1.0):
        s = CapacitySearch(LAT, settle=200)
        s.next_index()
        s.record(200, True, margin=margin)
        assert s.next_index() == 201
    # only a held settle point's first run moves the climb; the answer does not change
    for capacity in (200, 203, 215, 260):
        s = CapacitySearch(LAT, settle=200, lean=LEAN)
        while (k := s.next_index()) is not None:
            s.record(k, k <= capacity, margin=0.8 if k <= capacity else 1.2)
        assert s.result().index == capacity


def test_a_later_step_up_stays_within_twice_the_points_its_headroom_spans() -> None:
    # the settle point held at 90 % (10.6 points: the climb starts 5 up, then would double
    # to 10); a level that held at 99.9 % spans 0.1 of a point, so the next step is 1
    def climbed(margin: float | None) -> int | None:
        s = CapacitySearch(LAT, settle=200)
        s.next_index()
        s.record(200, True, margin=0.9)
        assert s.next_index() == 205
        s.record(205, True, margin=margin)
        return s.next_index()

    assert climbed(0.999) == 206
    assert math.ceil(ROOM_CAP * LAT.steps(1 / 0.95)) == 11
    assert climbed(0.95) == 215  # 11 points of cap: the doubled step of 10 stands
    assert climbed(0.97) == 205 + math.ceil(ROOM_CAP * LAT.steps(1 / 0.97))  # 7 < 10: capped
    assert climbed(None) == 215  # no headroom figure: the doubling as before
    # the cap moves only where the search probes, never where it ends
    for capacity in (200, 205, 206, 209, 230, 270):
        s = CapacitySearch(LAT, settle=200, lean=LEAN)
        while (k := s.next_index()) is not None:
            room = 1.0 - 0.002 * max(capacity - k, 0)  # closer to the SLO nearer capacity
            s.record(k, k <= capacity, margin=room if k <= capacity else 1.2)
        assert s.result().index == capacity


async def test_a_settle_points_first_run_stops_only_past_the_noise_band() -> None:
    cfg, _ = config(workload={"num_prompts": 200})
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload)
    model, hw = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_hardware("A100-80GB")
    runner = VirtualRunner(
        model,
        hw,
        model_name="m",
        static_args={},
        seed=7,
        jitter_cv=0.0,
        early_stop=plan.early_stop,
    )
    await runner.start({"max_num_seqs": 16}, "t")  # fails p99 TTFT at 4x
    bar = SettleBar(4.0, 0, band_pct=3.0)
    # stopped by the SLO itself, the level's p99 is a bound just past it: inside the band,
    # a near miss that would be measured again
    plain = (await runner.run_level(wl, 4.0)).metrics
    assert plain.stop is not None
    assert bar.near(score_level(plain, plan.slo, 4.0), LAT)
    # as a settle point's first run it stops once p99 is past the band: settled in one level
    m = await measure(runner, wl, plan, settle=bar)
    assert m.capacity is not None and m.capacity.status == "settled"
    [only] = m.levels
    assert only.outcome.metrics.stop is not None
    assert only.score.violations["p99_ttft"] >= 0.03
    assert runner.early_stop == plan.early_stop  # the study's rule again for what follows


async def test_over_http_too_the_settle_points_first_run_stops_past_the_band(
    tmp_path: Path,
) -> None:
    """The same rule through the HTTP runner and the load generator's stop, against the
    simulator's API server (a real process speaking vLLM's API)."""
    cfg, _ = config(workload={"num_prompts": 200})
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload, vocab_size=SIM_VOCAB)
    runner = sim_http_runner(cfg, tmp_path / "w", plan.early_stop)
    await runner.start({"max_num_seqs": 16}, "trial-0000")
    try:
        # a band wider than where the load generator's stop lands (it checks every 50 ms, so
        # its bound overshoots the SLO by more than the simulator's: 20 % here)
        m = await measure(runner, wl, plan, settle=SettleBar(4.0, 0, band_pct=30.0))
    finally:
        await runner.stop()
    assert m.capacity is not None and m.capacity.status == "settled"
    [only] = m.levels
    assert only.outcome.metrics.stop is not None
    assert only.score.violations["p99_ttft"] >= 0.30
    assert runner.early_stop == plan.early_stop


def _study(tmp_path: Path, name: str, settle: bool) -> tuple[Store, str]:
    cfg, text = config(
        name=name,
        strategy={"n_trials": 10, "capacity_levels": 24, "settle": settle},
    )
    s = Store.open(f"sqlite:///{tmp_path / (name + '.db')}")
    create_study(cfg, text, s)
    run_study(cfg.name, s)
    return s, cfg.name


@pytest.mark.config_field("strategy.settle")
def test_settled_trials_cost_less_and_keep_the_recommendation(tmp_path: Path) -> None:
    on, name_on = _study(tmp_path, "on", settle=True)
    off, name_off = _study(tmp_path, "off", settle=False)
    with on, off:
        t_on, t_off = on.trials(name_on), off.trials(name_off)
        settled = [t for t in t_on if t.state == "PRUNED"]
        assert settled, "no trial was settled"
        assert not [t for t in t_off if t.state == "PRUNED"]
        by_number = {t.optuna_trial_number: t for t in t_on}
        for t in settled:
            # settled against a better trial that ran before it, at its capacity (a trial
            # that ties the best is measured exactly), after at most 2 levels
            assert t.settled_against is not None and t.settled_against < t.optuna_trial_number
            against = by_number[t.settled_against]
            assert against.feasible and against.capacity_scale is not None
            assert t.settled_below == pytest.approx(against.capacity_scale, rel=1e-9)
            assert 1 <= len(t.levels) <= 2 and not any(lv.feasible for lv in t.levels)
            assert t.objective is None and t.feasible is None
        # the baseline is measured in full
        assert by_number[0].state == "COMPLETE" and len(by_number[0].levels) >= 3
        # Optuna sees them pruned; the sampler's plan still ran its 10 trials
        study = optuna.load_study(study_name=name_on, storage=on.optuna_storage())
        states = [t.state for t in study.trials]
        assert states.count(TrialState.PRUNED) == len(settled) and len(states) == 10
        # the same recommendation, for fewer replayed seconds
        best_on = max((t for t in t_on if t.feasible), key=lambda t: t.objective or 0)
        best_off = max((t for t in t_off if t.feasible), key=lambda t: t.objective or 0)
        assert best_on.capacity_scale == pytest.approx(best_off.capacity_scale)
        c_on, c_off = study_cost(t_on, []), study_cost(t_off, [])
        assert c_on.replayed_s < 0.7 * c_off.replayed_s
    # study show marks them, with the bound and the trial they were settled against
    res = CliRunner().invoke(
        app, ["study", "show", name_on, "--storage", f"sqlite:///{tmp_path / 'on.db'}"]
    )
    assert res.exit_code == 0, res.output
    assert "settled" in res.output and "below the best capacity so far" in res.output
    # study status counts them among the complete trials, and says how many
    res = CliRunner().invoke(
        app, ["study", "status", name_on, "--storage", f"sqlite:///{tmp_path / 'on.db'}"]
    )
    assert res.exit_code == 0, res.output
    assert f"complete: 10 of 10 planned ({len(settled)} settled)" in res.output
    # the report and the export say the same, with the trial it was settled against
    md = tmp_path / "r.md"
    url = f"sqlite:///{tmp_path / 'on.db'}"
    res = CliRunner().invoke(app, ["report", name_on, "--md", str(md), "--storage", url])
    assert res.exit_code == 0, res.output
    first = settled[0]
    row = next(
        ln
        for ln in md.read_text().splitlines()
        if ln.startswith(f"| {first.optuna_trial_number} |")
    )
    assert "| settled |" in row and f"(settled against trial {first.settled_against})" in row
    res = CliRunner().invoke(
        app, ["study", "export", name_on, "--format", "json", "--storage", url]
    )
    assert res.exit_code == 0, res.output
    exported = {t["optuna_trial_number"]: t for t in json.loads(res.output)["trials"]}
    cap = exported[first.optuna_trial_number]["capacity"]
    assert cap["status"] == "settled" and cap["bound"] == "<"
    assert cap["settled_against"] == first.settled_against
    assert cap["scale"] == pytest.approx(first.settled_below)


def test_the_bar_is_the_best_measured_capacity_and_skips_the_baseline(tmp_path: Path) -> None:
    cfg, _ = config()
    store, name = _study(tmp_path, "bar", settle=True)
    with store:
        study = optuna.load_study(study_name=name, storage=store.optuna_storage())
        trials = study.trials
    bar = settle_bar(cfg, trials, "max_num_seqs", 2.5)
    assert bar is not None and bar.band_pct == 2.5
    best = max(
        (t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")),
        key=lambda t: t.value or 0,
    )
    assert bar.against == best.number
    assert bar.scale == pytest.approx(best.user_attrs["capacity_scale"])
    assert settle_bar(cfg, trials, "baseline", None) is None
    assert settle_bar(cfg, trials, "enqueue-mine", None) is None
    assert settle_bar(cfg, [], "max_num_seqs", None) is None  # nothing to settle against
    off, _ = config(strategy={"settle": False})
    assert settle_bar(off, trials, "max_num_seqs", None) is None
    fixed, _ = config(mode="fixed-rate")
    assert settle_bar(fixed, trials, "max_num_seqs", None) is None


def _frozen(number: int, value: float | None, state: TrialState) -> optuna.trial.FrozenTrial:
    t = optuna.trial.create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        system_attrs={"constraints": [0.0]} if state == TrialState.COMPLETE else {},
        user_attrs={"capacity_scale": value / 100, "capacity_status": "found"} if value else {},
    )
    t.number = number
    return t


def test_a_trial_tpe_proposed_is_settled_at_the_edge_of_tpes_good_group() -> None:
    # docs/tuning.md#14-settling-losing-trials, "What the sampler sees": TPE splits the
    # finished trials into its good tenth and the rest, and puts pruned trials in the rest;
    # a joint-stage trial is settled at the last good trial's capacity, so every trial that
    # could join the good group is measured exactly and TPE's split is what full searches
    # would give
    cfg, _ = config()
    trials = [_frozen(i, 100.0 + i, TrialState.COMPLETE) for i in range(8)]
    trials += [_frozen(8 + i, None, TrialState.PRUNED) for i in range(3)]
    # 11 finished: the good group is the best 2 (trials 7 and 6)
    assert tpe_good_group(11) == 2 and tpe_good_group(10) == 1 and tpe_good_group(400) == 25
    # the same split as the TPE sampler the strategy builds (Optuna's default gamma)
    from optuna.samplers._tpe.sampler import default_gamma

    assert all(tpe_good_group(n) == default_gamma(n) for n in range(500))
    joint = settle_bar(cfg, trials, "joint", None)
    assert joint is not None and joint.against == 6 and joint.scale == pytest.approx(1.06)
    # a compass move of the staged joint refinement is settled at the best: the compass
    # reads only whether a move beat the best point, not TPE's split
    compass = settle_bar(cfg, trials, "joint", None, compass=True)
    assert compass is not None and compass.against == 7 and compass.scale == pytest.approx(1.07)
    # a line-search stage is settled at the best
    line = settle_bar(cfg, trials, "max_num_seqs", None)
    assert line is not None and line.against == 7
    # fewer feasible complete trials than the good group holds: TPE would fill it with
    # pruned trials, so nothing is settled
    few = [_frozen(0, 100.0, TrialState.COMPLETE)]
    few += [_frozen(1 + i, None, TrialState.PRUNED) for i in range(10)]
    assert settle_bar(cfg, few, "joint", None) is None
    bar = settle_bar(cfg, few, "joint", None, compass=True)
    assert bar is not None and bar.against == 0


@pytest.mark.parametrize("strategy", ["staged", "joint"])
def test_the_staged_joint_refinements_compass_moves_are_settled_at_the_best(
    tmp_path: Path, strategy: str
) -> None:
    # the compass proposes the staged joint refinement's trials and says so on each; a
    # settled one was settled against the best trial before it. The joint strategy's trials
    # are TPE's and carry no such mark
    # five moves: the first ones walk a plateau of ties (each tied diagonal split into its
    # axis moves, docs/tuning.md#8-the-staged-plan) before one is settled
    st = {"name": strategy, "n_trials": 11, "capacity_levels": 24, "trials_per_stage": 2}
    cfg, text = config(name="compass", strategy={**st, "joint_refinement": 5})
    store = Store.open(f"sqlite:///{tmp_path / 'compass.db'}")
    create_study(cfg, text, store)
    run_study(cfg.name, store)
    with store:
        study = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
        records = {t.optuna_trial_number: t for t in store.trials(cfg.name)}
    moved = [t for t in study.trials if attrs.compass_moved(t)]
    if strategy == "joint":
        assert not moved
        return
    joint = [t for t in study.trials if attrs.stage_of(t) == "joint"]
    assert len(joint) == 5 and moved == joint
    settled = [t for t in joint if t.state == TrialState.PRUNED]
    assert settled, "no compass move was settled"
    for t in settled:
        before = [
            u
            for u in study.trials
            if u.number < t.number and u.state == TrialState.COMPLETE and u.user_attrs["feasible"]
        ]
        best = max(before, key=lambda u: u.value or 0.0)
        assert records[t.number].settled_against == best.number
