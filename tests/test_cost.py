"""What a study costs in device time (docs/cost.md): the modelled start-up of a simulated
vLLM, the meter a runner counts a worker with, every trial's and validation run's cost
stored on both backends and summed, a failed start charged as far as it got, devices held
under tensor parallelism, and a measured worker charged its lifetime as ``/proc`` records it.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import support.lifetimes as lifetimes
from support.databases import BACKENDS, fresh_database
from support.lifetimes import ChildLifetimes
from support.runners import ScriptedRunner
from support.studies import config

from autotune.failures import FailureClass
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import modelled_startup
from autotune.sim.startup_time import (
    ARG_CHECK_S,
    COMPILE_S,
    GRAPH_CAPTURE_S,
    OVERHEAD_S,
    PROFILE_S,
    WEIGHT_LOAD_BPS,
)
from autotune.store import RepeatRecord, Store, TrialRecord, WorkerUsage
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.level_plan import LevelPlan
from autotune.tuning.measure.outcome import replay_seconds
from autotune.tuning.measure.trial import TrialSetup, run_trial
from autotune.tuning.measure.usage import UsageMeter, sim_startup_s
from autotune.tuning.measure.validation_plan import worker_starts
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.gpu_budget import (
    CAPACITY_POSITIONS,
    SETTLE_LEVELS,
    SIMULATED_CAPACITY,
    VALIDATION_LEVELS,
    CostEstimate,
    estimate,
    level_seconds,
    over_budget,
    search_scales,
    simulated_capacity,
)
from autotune.tuning.run.status import plan_estimate, study_plan
from autotune.workers.devices import devices_held
from autotune.workers.procstat import ProcStat
from autotune.workers.sim_worker import SimWorker
from autotune.workload.build import build_workload

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


# -- the start-up model ------------------------------------------------------------------
def test_a_start_is_the_sum_of_its_phases_and_eager_skips_compile_and_graphs() -> None:
    model = get_model(LLAMA_8B)
    est = modelled_startup(model)
    weights = model.weight_bytes(1) / WEIGHT_LOAD_BPS
    assert est.weights_s == pytest.approx(weights) and 3.5 < weights < 4.5  # 16 GB at 3.8 GiB/s
    assert est.total_s == pytest.approx(
        OVERHEAD_S + weights + COMPILE_S + PROFILE_S + GRAPH_CAPTURE_S
    )
    eager = modelled_startup(model, enforce_eager=True)
    assert eager.total_s == pytest.approx(OVERHEAD_S + weights + PROFILE_S)
    # ranks read their shard in parallel
    assert modelled_startup(model, tensor_parallel_size=2).weights_s == pytest.approx(
        model.weight_bytes(2) / WEIGHT_LOAD_BPS
    )


def test_a_failed_start_is_charged_as_far_as_vllm_gets() -> None:
    model = get_model(LLAMA_8B)
    full = modelled_startup(model)
    # a rejected argument: the imports, then the error
    assert modelled_startup(model, failure=FailureClass.MNBT_LT_MNS).total_s == ARG_CHECK_S
    # a memory error: after loading and profiling, before any graph
    kv = modelled_startup(model, failure=FailureClass.KV_TOO_SMALL)
    assert kv.graphs_s == 0 and kv.total_s == pytest.approx(full.total_s - GRAPH_CAPTURE_S)


def test_devices_held_are_the_given_devices_else_the_parallel_sizes() -> None:
    assert devices_held({}) == 1
    assert devices_held({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert devices_held({"tensor-parallel-size": 4}) == 4
    assert devices_held({"tensor_parallel_size": 2}, "0,1,2") == 3


# -- the meter -----------------------------------------------------------------------------
def test_the_meter_charges_a_simulated_worker_its_model_and_a_real_one_its_lifetime() -> None:
    m = UsageMeter()
    assert m.last is None
    m.begin(devices=2)
    m.replayed(30.0)
    m.replayed(12.5)
    m.started(60.0)  # a simulated worker's modelled start-up
    m.end()
    assert m.last == WorkerUsage(102.5, 60.0, 42.5, 2, True)
    assert m.last.gpu_s == 205.0
    m.end(1.0)  # ended once: a second end changes nothing
    assert m.last.worker_s == 102.5
    m.begin(devices=1)
    assert m.last is None  # a new worker's cost, never the last one's
    m.started(20.0)
    m.replayed(5.0)
    m.end(lifetime_s=31.0)
    assert m.last == WorkerUsage(31.0, 20.0, 5.0, 1, False)
    m.begin(devices=1)  # never served: all of its life was start-up
    m.end(lifetime_s=9.0)
    assert m.last == WorkerUsage(9.0, 9.0, 0.0, 1, False)


def test_a_worker_shared_by_runs_is_split_into_parts_that_add_up_to_its_life() -> None:
    # docs/cost.md#1-what-is-counted: a validation run that leaves its worker to the next
    # run is charged the worker's cost so far; the start-up goes to the first part
    m = UsageMeter()
    m.begin(devices=2)
    m.started(10.0)
    m.replayed(5.0)
    assert m.split(30.0) == WorkerUsage(30.0, 10.0, 5.0, 2, False)
    m.replayed(7.0)
    assert m.split(50.0) == WorkerUsage(20.0, 0.0, 7.0, 2, False)
    assert m.open
    m.end(lifetime_s=61.0)  # what is left: the idle tail before the stop
    assert m.last == WorkerUsage(11.0, 0.0, 0.0, 2, False)
    # a simulated worker: its modelled start-up, then its load, run by run
    m.begin(devices=1)
    m.started(65.0)
    m.replayed(10.0)
    assert m.split() == WorkerUsage(75.0, 65.0, 10.0, 1, True)
    m.replayed(20.0)
    m.end()
    assert m.last == WorkerUsage(20.0, 0.0, 20.0, 1, True)


# -- a study, stored and summed ----------------------------------------------------------
@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with fresh_database(request.param, tmp_path) as url, Store.open(url, upgrade=True) as s:
        yield s


def test_every_worker_of_a_study_is_counted_stored_and_summed(store: Store) -> None:
    cfg, text = config(
        enqueue=[{"max_num_seqs": 64, "max_num_batched_tokens": 32}],  # refused at start-up
        strategy={
            "name": "joint",
            "n_trials": 4,
            "validate": {"enabled": True, "top_k": 1, "repeats": 2},
            "min_level_s": 0,
            "min_level_requests": 0,
        },
        worker={"kind": "sim-virtual", "static_args": {"tensor_parallel_size": 2}},
    )
    create_study(cfg, text, store)
    run_study(cfg.name, store)
    trials, repeats = store.trials(cfg.name), store.repeats(cfg.name)
    model = get_model(cfg.model.name)
    assert [t.stage for t in trials][:2] == ["baseline", "enqueue-0"]
    for t in trials:
        u = t.usage
        assert u is not None and u.cost_modelled and u.devices_held == 2, t
        assert u.gpu_s == pytest.approx(2 * u.worker_s)
        assert u.worker_s == pytest.approx(u.worker_startup_s + u.replayed_s)
    base, refused, sampled = trials[:3]
    # the refused config: charged the argument check, nothing replayed
    assert refused.failure_class == "MNBT_LT_MNS"
    assert refused.usage == WorkerUsage(ARG_CHECK_S, ARG_CHECK_S, 0.0, 2, True)
    # a served config: the modelled start plus exactly the load its levels replayed
    args = {"tensor_parallel_size": 2, **sampled.engine_args}
    assert sampled.usage is not None
    assert sampled.usage.worker_startup_s == pytest.approx(sim_startup_s(model, args))
    stored = sum(replay_seconds(lv.metrics) for lv in sampled.levels)
    assert stored > 0 and sampled.usage.replayed_s == pytest.approx(stored)
    # the baseline also replayed its boundary level twice more: the server's noise
    assert base.usage is not None
    searched = sum(replay_seconds(lv.metrics) for lv in base.levels)
    boundary = base.headline_level()
    assert boundary is not None
    noise_s = base.usage.replayed_s - searched
    assert noise_s == pytest.approx(2 * replay_seconds(boundary.metrics), rel=0.05)
    # validation runs are counted too
    done = [r for r in repeats if r.state == "COMPLETE"]
    assert done and all(r.usage is not None and r.usage.replayed_s > 0 for r in done)
    cost = study_cost(trials, repeats)
    # the candidate's two runs (repeat 0's last, repeat 1's first) share one worker: the
    # second charges no start-up (docs/tuning.md#7-validation, "One worker for a block")
    started = [r for r in done if r.usage is not None and r.usage.worker_startup_s > 0]
    assert len(done) == 4 and len(started) == 3
    kept = [r for r in done if r not in started]
    assert [(r.repeat_index, r.role) for r in kept] == [(1, "candidate")]
    for r in done:
        assert r.usage is not None
        assert r.usage.worker_s == pytest.approx(r.usage.worker_startup_s + r.usage.replayed_s)
    assert cost.worker_starts == len(trials) + 3 and cost.trials == 4
    assert cost.trials_gpu_s == pytest.approx(sum(t.usage.gpu_s for t in trials if t.usage))
    assert cost.validation_gpu_s == pytest.approx(sum(r.usage.gpu_s for r in done if r.usage))
    assert cost.gpu_hours == pytest.approx(cost.gpu_s / 3600)
    assert cost.modelled and cost.uncounted == 0
    assert cost.text.startswith(f"cost: {cost.gpu_hours:.2f} GPU-hours (4 trials ")
    assert "validation" in cost.text and "start-up modelled" in cost.text


def test_records_without_a_cost_are_named_not_counted_as_zero() -> None:
    old = TrialRecord("s", 0, "baseline", "COMPLETE", {}, {}, None, None, "vllm")
    old.started_at = old.finished_at = None
    new = TrialRecord("s", 1, "joint", "COMPLETE", {}, {}, None, None, "vllm")
    for k, v in WorkerUsage(100.0, 40.0, 50.0, 1, False).fields().items():
        setattr(new, k, v)
    from datetime import UTC, datetime

    old.started_at = datetime.now(UTC)
    pending = RepeatRecord("s", 0, 0, 1, "candidate", {}, "seed 1", 1, 1)
    cost = study_cost([old, new], [pending])
    assert cost.gpu_s == 100.0 and cost.worker_starts == 1 and cost.uncounted == 1
    assert "1 older records not counted" in cost.text and "modelled" not in cost.text
    assert study_cost([], []).text == "cost: nothing counted yet"


def test_an_interrupted_trial_keeps_its_cost(tmp_path: Path) -> None:
    cfg, _ = config(mode="fixed-rate")
    runner = ScriptedRunner(
        raise_in_level=(0, asyncio.CancelledError()),
        cost=WorkerUsage(12.0, 10.0, 2.0, 1, False),
    )
    wl = build_workload(cfg.workload, vocab_size=32_000)
    with Store.open(f"sqlite:///{tmp_path / 'c.db'}") as s:
        from autotune.tuning.run.create import create_study as create

        create(cfg, "x: 1", s)
        setup = TrialSetup(cfg, runner, wl, s, cfg.name)
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(run_trial(setup, number=0, stage="baseline", params={}, engine_args={}))
        (t,) = s.trials(cfg.name)
    assert t.state == "FAIL" and t.usage == WorkerUsage(12.0, 10.0, 2.0, 1, False)


# -- a measured worker -------------------------------------------------------------------
def test_a_measured_worker_is_charged_its_lifetime_as_proc_records_it(tmp_path: Path) -> None:
    """A worker process counted as real vLLM is (its lifetime measured, not modelled):
    within 5 % of its start in /proc to its exit."""
    cfg, _ = config(workload={"num_prompts": 20, "rate": 10})
    hw = get_hardware(cfg.hardware)
    sim = SimWorker(model=cfg.model.name, hardware=hw.name, workdir=tmp_path / "w", time_scale=1.0)
    runner = HttpRunner(
        sim,
        kind="vllm",
        model_name=cfg.model.name,
        endpoint="completions",
        vocab_size=32_000,
        time_scale=1.0,
    )
    wl = build_workload(cfg.workload, vocab_size=32_000)

    async def one_worker() -> None:
        await runner.start({"max_num_seqs": 8}, "trial-0000")
        try:
            await runner.run_level(wl, 1.0)
            await asyncio.sleep(0.5)  # idle time is device time too
        finally:
            await runner.stop()

    with ChildLifetimes() as watch:
        asyncio.run(one_worker())
    (life,) = watch.lifetimes.values()
    u = runner.usage()
    assert u is not None and not u.cost_modelled and u.devices_held == 1
    assert math.isclose(u.worker_s, life, rel_tol=0.05), (u, life)
    assert 0 < u.worker_startup_s < u.worker_s and 1.0 < u.replayed_s < u.worker_s

    # one worker serving two runs (docs/tuning.md#7-validation): the first run's part and
    # what is left at the stop add up to the lifetime /proc records
    parts = []

    async def shared_worker() -> None:
        await runner.start({"max_num_seqs": 8}, "validate-0-0001")
        try:
            await runner.run_level(wl, 1.0)
            parts.append(runner.split_usage())
            assert runner.reseed(7)  # real vLLM brings its own noise: any seed will do
            await runner.run_level(wl, 1.0)
            await asyncio.sleep(0.3)
        finally:
            await runner.stop()
        parts.append(runner.usage())
        assert not runner.reseed(7)  # nothing runs any more

    with ChildLifetimes() as watch:
        asyncio.run(shared_worker())
    (life,) = watch.lifetimes.values()
    first, rest = parts
    assert first is not None and rest is not None
    assert first.worker_startup_s > 0 and rest.worker_startup_s == 0
    assert first.replayed_s > 1.0 and rest.replayed_s > 1.0
    assert math.isclose(first.worker_s + rest.worker_s, life, rel_tol=0.05), (parts, life)


def test_the_lifetime_watch_outlasts_a_scan_that_misses_a_living_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The measuring stick of the test above: a child left out of one scan (its command line
    can read empty for a moment) is still alive, so its lifetime runs to its real exit."""
    scan = lifetimes.children_matching
    scans = {"n": 0}

    def flaky(match: Callable[[bytes], bool]) -> list[ProcStat]:
        scans["n"] += 1
        return [] if scans["n"] == 5 else scan(match)

    monkeypatch.setattr(lifetimes, "children_matching", flaky)
    with ChildLifetimes() as watch:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)", "serve"])
        child.wait()
        time.sleep(0.1)
    (life,) = watch.lifetimes.values()
    assert scans["n"] > 5 and 0.9 < life < 1.5, (scans, life)


# -- the plan's estimate and the budget ----------------------------------------------------
def test_the_estimate_prices_the_products_own_search_and_level_lengths() -> None:
    cfg, _ = config(strategy={"min_level_s": 30, "min_level_requests": 200, "capacity_levels": 24})
    model = get_model(cfg.model.name)
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)
    plan = LevelPlan.of(cfg)
    # the search from the lattice's ends: the top first, then bisection towards the capacity
    lat = plan.lattice
    for position in CAPACITY_POSITIONS:
        capacity = lat.low * (lat.high / lat.low) ** position
        scales = search_scales(plan, position)
        assert scales[0] == lat.scale(lat.top)
        assert 4 <= len(scales) <= plan.max_levels and len(set(scales)) == len(scales)
        held = [sc for sc in scales if sc <= capacity]
        assert held and max(held) == pytest.approx(capacity, rel=2 * lat.resolution)
    # a capacity below the middle sends the search towards the bottom, the slowest level,
    # but never to it while a point above it holds
    mid = lat.scale(lat.top // 2)
    assert min(search_scales(plan, 0.2)) < mid == min(search_scales(plan, 0.8))
    assert all(lat.low not in search_scales(plan, p) for p in CAPACITY_POSITIONS)
    assert search_scales(LevelPlan.of(config(mode="fixed-rate")[0])) == [1.0]
    # 120 requests at 4 req/s span about 30 s: at 0.25x a level lasts 4 x that, looped to
    # 200 requests (two copies)
    span = float(wl.arrivals()[-1])
    assert level_seconds(wl, 0.25, 30, 200) == (pytest.approx(2 * span / 0.25), False)
    assert level_seconds(wl, 4.0, 30, 0) == (
        pytest.approx(math.ceil(30 * 4 / span) * span / 4),
        False,
    )
    closed, _ = config(mode="offline", workload={"arrival": "closed", "concurrency": 8})
    assert level_seconds(build_workload(closed.workload), 1.0, 30, 200) == (30, True)
    est = estimate(cfg, model, wl, trials=24)
    searches = [search_scales(plan, p) for p in CAPACITY_POSITIONS]
    levels = sum(level_seconds(wl, sc, 30, 200)[0] for one in searches for sc in one)
    levels /= len(searches)
    startup = sim_startup_s(model, {})
    assert est.full == pytest.approx(startup + levels)  # the baseline: a full search
    # a later trial is settled: SETTLE_LEVELS levels at the capacity positions
    lat = plan.lattice
    at = [level_seconds(wl, lat.low * (lat.high / lat.low) ** p, 30, 200)[0]
          for p in CAPACITY_POSITIONS]  # fmt: skip
    assert est.trial_gpu_s == pytest.approx(startup + SETTLE_LEVELS * sum(at) / len(at))
    assert est.trial_gpu_s < est.full
    assert est.noise_gpu_s == pytest.approx(2 * level_seconds(wl, 1.0, 30, 200)[0])
    assert est.search_gpu_s == pytest.approx(est.full + 23 * est.trial_gpu_s + est.noise_gpu_s)
    v = cfg.strategy.validate_
    reps = (v.top_k + 1) * cfg.validation_repeats
    assert est.validation_runs == reps
    # each run a search from its config's capacity: VALIDATION_LEVELS levels there; a
    # worker per block of runs (3 configs, 5 rounds: 3 + 4 x 2 starts, docs/tuning.md#7-validation)
    starts = worker_starts(cfg.validation_repeats, v.top_k + 1)
    assert starts == 11
    run = VALIDATION_LEVELS * sum(at) / len(at)
    assert est.validation_gpu_s == pytest.approx(starts * startup + reps * run)
    # a `sim` server's noise is fixed at its launch: every run starts one
    sim, _ = config(strategy=cfg.strategy.model_dump(by_alias=True), worker={"kind": "sim"})
    assert estimate(sim, model, wl, 24).validation_gpu_s == pytest.approx(reps * (startup + run))
    unsettled, _ = config(strategy={**cfg.strategy.model_dump(by_alias=True), "settle": False})
    plain = estimate(unsettled, model, wl, trials=24)
    assert plain.trial_gpu_s == pytest.approx(est.full)
    ends, _ = config(
        strategy={**cfg.strategy.model_dump(by_alias=True), "validate": {"from_capacity": False}}
    )
    assert estimate(ends, model, wl, 24).validation_gpu_s == pytest.approx(
        starts * startup + reps * levels
    )
    # at its fewest the phase runs the best config and the baseline up to the early look
    # (3 of 5 repeats here): 6 runs on 4 workers (2, then 1 more per later round)
    least = 4 * startup + 6 * run
    assert est.validation_least_gpu_s == pytest.approx(least)
    assert est.gpu_hours_least == pytest.approx((est.search_gpu_s + least) / 3600)
    assert est.text.startswith(
        f"about {est.gpu_hours_least:.2f}-{est.gpu_hours:.2f} GPU-hours (24 trials of about "
    )
    assert est.text.endswith(f", validation {least / 3600:.2f}-{est.validation_gpu_s / 3600:.2f})")
    # without the early look the fewest runs are the two configs' 5 repeats each
    patient, _ = config(
        strategy={**cfg.strategy.model_dump(by_alias=True), "validate": {"stop_early": False}}
    )
    slow = estimate(patient, model, wl, 24)
    assert slow.validation_least_gpu_s == pytest.approx(worker_starts(5, 2) * startup + 10 * run)
    assert estimate(closed, model, build_workload(closed.workload), 3).text.startswith("at least")
    off, _ = config(
        strategy={**cfg.strategy.model_dump(by_alias=True), "validate": {"enabled": False}}
    )
    assert estimate(off, model, wl, 24).text.startswith(f"about {est.search_gpu_s / 3600:.2f} GPU")


def test_the_estimate_places_its_levels_at_the_simulated_capacity(tmp_path: Path) -> None:
    # `study create` simulates the baseline's capacity; the plan prices every level there
    # (docs/cost.md#3-the-plan-and-the-budget) instead of over CAPACITY_POSITIONS
    cfg, text = config(strategy={"min_level_s": 30, "min_level_requests": 200})
    model = get_model(cfg.model.name)
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)
    plan = LevelPlan.of(cfg)
    lat = plan.lattice
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as s:
        rec = create_study(cfg, text, s)
        simulated = rec.workload_profile[SIMULATED_CAPACITY]
        est = plan_estimate(s, cfg.name)
    # the plan line and the budget read it alike; a profile without it (an older study, a
    # configured peak concurrency) prices over the positions
    assert simulated_capacity(rec.workload_profile) == simulated
    assert simulated_capacity({}) is None and simulated_capacity({SIMULATED_CAPACITY: 0}) is None
    assert est is not None and lat.low < simulated < lat.high
    position = math.log(simulated / lat.low) / math.log(lat.high / lat.low)
    startup = sim_startup_s(model, {})
    searched = sum(level_seconds(wl, sc, 30, 200)[0] for sc in search_scales(plan, position))
    at = level_seconds(wl, simulated, 30, 200)[0]
    assert est.full == pytest.approx(startup + searched)
    assert est.trial_gpu_s == pytest.approx(startup + SETTLE_LEVELS * at)
    # the noise re-runs replay the baseline's capacity level
    assert est.noise_gpu_s == pytest.approx(2 * at)
    assert est == estimate(cfg, model, wl, est.trials, capacity=simulated)
    assert est != estimate(cfg, model, wl, est.trials)
    # a mode without a capacity search simulates nothing and prices one level at 1.0x
    fixed, fixed_text = config(mode="fixed-rate")
    with Store.open(f"sqlite:///{tmp_path / 'f.db'}") as s:
        assert SIMULATED_CAPACITY not in create_study(fixed, fixed_text, s).workload_profile


def test_over_budget_counts_what_was_spent_what_runs_and_the_validation_after() -> None:
    cfg, _ = config(strategy={"gpu_hours": 1.0})
    est = CostEstimate(10, trial_gpu_s=600.0, noise_gpu_s=60.0, validation_runs=2,
                       lower_bound=False)  # fmt: skip
    nothing = study_cost([], [])
    # before any trial is counted: the plan's prices, the noise re-runs included
    assert not over_budget(cfg, est, nothing, running=2)  # 3 x 600 + 60 + 1200 = 3060
    assert over_budget(cfg, est, nothing, running=3)  # 3660
    # but the baseline, the first trial, always runs
    tiny, _ = config(strategy={"gpu_hours": 0.001})
    assert not over_budget(tiny, est, nothing, running=0)
    assert over_budget(tiny, est, nothing, running=1)
    # once trials are counted they set the price; validation runs are full searches, at
    # the plan's price until a baseline is counted: 2 trials of 300 s: 600 spent +
    # (running + the next) x 300 + 2 validation runs x 600
    done = [_counted(i, 300.0) for i in range(2)]
    assert not over_budget(cfg, est, study_cost(done, []), running=5)  # 600 + 1800 + 1200
    assert over_budget(cfg, est, study_cost(done, []), running=6)
    # counted trials dearer than the plan's full search price the validation runs too
    # full validation searches are priced as the counted baseline's: 600 + 300 + 2 x 1000 =
    # 2900, 2 x 1400: 3700
    full, _ = config(strategy={"gpu_hours": 1.0, "validate": {"from_capacity": False}})
    assert not over_budget(full, est, study_cost(done, []), running=0, full_gpu_s=1000.0)
    assert over_budget(full, est, study_cost(done, []), running=0, full_gpu_s=1400.0)
    assert not over_budget(cfg, est, study_cost(done, []), running=0, full_gpu_s=1400.0)
    assert not over_budget(config()[0], est, nothing, running=99)  # no budget, no limit


def _counted(number: int, gpu_s: float) -> TrialRecord:
    t = TrialRecord("s", number, "joint", "COMPLETE", {}, {}, None, None, "sim-virtual")
    for k, v in WorkerUsage(gpu_s, 60.0, gpu_s - 60.0, 1, True).fields().items():
        setattr(t, k, v)
    return t


@pytest.mark.config_field("strategy.gpu_hours")
def test_a_budget_ends_the_search_early_and_the_validation_still_runs(tmp_path: Path) -> None:
    base = {"name": "joint", "n_trials": 12, "validate": {"enabled": True, "top_k": 1}}
    # every trial a full search, so that a trial and a validation run cost alike
    base |= {"min_level_s": 0, "min_level_requests": 0, "settle": False}
    base["validate"] |= {"from_capacity": False}
    # what the study costs without a budget: its trials' mean price and its validation's
    free, free_text = config(strategy=base)
    with Store.open(f"sqlite:///{tmp_path / 'free.db'}") as s:
        create_study(free, free_text, s)
        run_study(free.name, s)
        unbudgeted = study_cost(s.trials(free.name), s.repeats(free.name))
    assert unbudgeted.trials == 12
    mean = unbudgeted.trials_gpu_s / unbudgeted.trials
    # room for the validation phase's 10 runs (priced as the baseline's search) and about 9
    # trials, which the 10-run reserve leaves about half of
    hours = 19.5 * mean / 3600
    cfg, text = config(strategy=base | {"gpu_hours": hours})
    model = get_model(cfg.model.name)
    est = estimate(cfg, model, build_workload(cfg.workload, vocab_size=model.vocab_size), 12)
    with Store.open(f"sqlite:///{tmp_path / 'b.db'}") as s:
        create_study(cfg, text, s)
        (line,) = [ln for ln in study_plan(s, cfg.name) if "GPU-hours" in ln]
        assert line.endswith(f"; budget {hours:g} GPU-hours (strategy.gpu_hours)")
        report = run_study(cfg.name, s)
        trials, repeats = s.trials(cfg.name), s.repeats(cfg.name)
    assert report.stopped_by == "gpu budget" and 2 <= report.trials_run < 12
    # the validation phase ran on what the search had
    assert report.validation_runs > 0 and all(r.state == "COMPLETE" for r in repeats)
    # it stopped because one more trial, at the mean price of those counted, would not have
    # left the validation phase its room
    spent = study_cost(trials, [])
    price = spent.trials_gpu_s / spent.trials
    assert est.validation_runs == 10
    (base,) = [t.usage.gpu_s for t in trials if t.stage == "baseline" and t.usage]
    assert spent.gpu_s + price + est.validation_runs * base > hours * 3600
    # and the whole study, validation included, kept to the budget
    assert study_cost(trials, repeats).gpu_s <= hours * 3600
