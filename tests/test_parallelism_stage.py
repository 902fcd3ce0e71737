"""The parallelism stage (docs/tuning.md#16-the-parallelism-stage): with
``search.parallelism`` a study searches ``tensor_parallel_size`` first, per device, and the
fixed order then runs inside the size it chose; each trial's devices follow its size."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import optuna
import pytest
import yaml
from support.studies import config

from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.store import Store
from autotune.tuning.measure.per_device import SERVER_DEVICES_KEY, PerDevice
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.gpu_budget import estimate
from autotune.tuning.run.lanes import plan_lanes
from autotune.tuning.run.status import study_plan
from autotune.tuning.search.home_size import home_trial
from autotune.tuning.search.plan import build_bounds, model_of
from autotune.tuning.search.space import TP_PARAM
from autotune.tuning.search.stages import stage_params
from autotune.tuning.study_attrs import bounds_from_json, read_header
from autotune.workload.build import build_workload
from autotune.workload.sustain import tiled

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
field = pytest.mark.config_field


def par_config(n_trials: int = 6, **over: object) -> tuple[object, str]:
    return config(
        search={"parallelism": 2},
        strategy={
            "n_trials": n_trials,
            "trials_per_stage": 1,
            "joint_refinement": 0,
            "validate": {"enabled": False},
        },
        **over,
    )


@field("search.parallelism")
def test_the_stage_comes_first_and_the_order_runs_inside_its_choice(tmp_path: Path) -> None:
    cfg, text = par_config(n_trials=8)
    with Store.open(f"sqlite:///{tmp_path / 'p.db'}") as store:
        create_study(cfg, text, store)  # type: ignore[arg-type]
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        b = read_header(study).bounds
        assert b.parallel == (1, 2) and stage_params(b)[0] == "tensor_parallel_size"
        run_study("t", store)
        trials = sorted(store.trials("t"), key=lambda t: t.optuna_trial_number)
    stages = [t.stage for t in trials]
    # the stage right after the baseline, once in pass 1; the four knobs' stages after it
    assert stages[:2] == ["baseline", "tensor_parallel_size"]
    assert stages.count("tensor_parallel_size") == 1 and len(stages) == 8
    tps = [t.engine_args["tensor_parallel_size"] for t in trials]
    assert tps[:2] == [1, 2]
    # the stage's verdict, per device, holds the rest of pass 1
    first_two = [t for t in trials[:2] if t.feasible]
    chosen = max(first_two, key=lambda t: t.objective or 0).engine_args["tensor_parallel_size"]
    pass1 = [t for t in trials[2:] if "." not in t.stage and t.stage != "joint"]
    assert pass1 and all(t.engine_args["tensor_parallel_size"] == chosen for t in pass1)
    # after the knobs are tuned, the other size is measured again at the tuned point
    again = [t for t in trials if t.stage == "tensor_parallel_size.2"]
    assert [t.engine_args["tensor_parallel_size"] for t in again] == [3 - chosen]
    before = [t for t in trials if t.optuna_trial_number < again[0].optuna_trial_number]
    best = max(before, key=lambda t: t.objective or 0)
    assert best.engine_args["tensor_parallel_size"] == chosen
    # carried over per device: a server of half (twice) the devices holds half (twice)
    # the sequences and tokens at the same load per device
    ratio = (3 - chosen) / chosen
    ranges = {"max_num_seqs": (b.mns_low, b.mns_high), "max_num_batched_tokens": (1, 1 << 30)}
    for k, (lo, hi) in ranges.items():
        want = min(max(round(best.engine_args[k] * ratio), lo), hi)
        got = again[0].engine_args[k]
        # max_num_batched_tokens is raised to max_num_seqs when below it (vLLM's rule)
        assert got == want or (k == "max_num_batched_tokens" and got >= want)
    # every level says how many devices its per-device figures are of
    for t in trials:
        for lv in t.levels:
            assert lv.metrics[SERVER_DEVICES_KEY] == t.engine_args["tensor_parallel_size"]


def test_the_max_num_seqs_ceiling_is_the_largest_sizes() -> None:
    """A server of k devices is offered k copies of the load, so it holds k times the peak:
    the default ceiling (twice the peak) is the largest size's, and a range the user sets
    stays theirs."""
    cfg, _ = par_config(workload={"peak_concurrency": 90})
    wl = build_workload(cfg.workload)  # type: ignore[attr-defined]
    b = build_bounds(cfg, model_of(cfg), wl.profile(), 0)  # type: ignore[arg-type]
    assert b.parallel == (1, 2) and b.mns_high == 2 * 2 * 90
    one, _ = config(workload={"peak_concurrency": 90})
    assert build_bounds(one, model_of(one), wl.profile(), 0).mns_high == 2 * 90
    mine, _ = config(search={"parallelism": 2, "max_num_seqs": {"high": 64}})
    assert build_bounds(mine, model_of(mine), wl.profile(), 0).mns_high == 64  # type: ignore[arg-type]


def test_a_level_is_measured_per_device() -> None:
    cfg, _ = par_config()
    model, hw = get_model(MODEL), get_hardware("A100-80GB")
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)  # type: ignore[attr-defined]

    def runner() -> VirtualRunner:
        return VirtualRunner(model, hw, model_name=MODEL, static_args={}, seed=3, jitter_cv=0.0)

    args = {"max_model_len": 2048, "max_num_seqs": 64, "tensor_parallel_size": 2}

    async def go() -> tuple[object, object]:
        per, plain = PerDevice(runner(), {}), runner()
        await per.start(args, "a")
        await plain.start(args, "b")
        # two copies of the sample at twice the rate: as long a level as one device's
        twice = tiled(wl, 2)
        return await per.run_level(wl, 1.5), await plain.run_level(twice, 3.0)

    per_out, whole = asyncio.run(go())
    assert per_out.scale == 1.5 and whole.scale == 3.0  # type: ignore[attr-defined]
    pm, wm = per_out.metrics, whole.metrics  # type: ignore[attr-defined]
    assert pm.output_throughput == pytest.approx(wm.output_throughput / 2)
    assert pm.request_throughput == pytest.approx(wm.request_throughput / 2)
    assert pm.summary["output_throughput"] == pytest.approx(wm.summary["output_throughput"] / 2)
    assert pm.completed == 2 * len(wl.requests)  # type: ignore[attr-defined]
    assert (pm.p99_ttft_ms, pm.p99_tpot_ms, pm.completed) == (
        wm.p99_ttft_ms,
        wm.p99_tpot_ms,
        wm.completed,
    )
    assert pm.summary[SERVER_DEVICES_KEY] == 2


def test_lanes_fit_the_largest_size_and_a_trial_takes_its_own() -> None:
    cfg, _ = par_config(worker={"kind": "sim-virtual"})
    plan = plan_lanes("0,1,2,3", None, cfg)  # type: ignore[arg-type]
    assert plan.lanes == (("0", "1"), ("2", "3"))
    assert plan.devices_for(1, {"tensor_parallel_size": 1}) == "2"
    assert plan.devices_for(1, {"tensor_parallel_size": 2}) == "2,3"


def test_a_fixed_parallel_size_and_the_stage_are_refused_together() -> None:
    cfg, _ = config()
    d = cfg.model_dump(mode="json", by_alias=True, exclude_unset=True)
    d["search"] = {"parallelism": 4}
    d["worker"] = {"kind": "sim-virtual", "static_args": {"tensor-parallel-size": 2}}
    with pytest.raises(ConfigError, match=r"search\.parallelism searches tensor_parallel_size"):
        parse_config(yaml.safe_dump(d), "p.yaml")


def test_a_study_stored_before_the_stage_reads_back_without_it() -> None:
    # the bounds JSON of a study created before search.parallelism existed
    b = bounds_from_json(json.dumps({"max_model_len_candidates": [1024], "extras": []}))
    assert b.parallel == () and stage_params(b)[0] == "max_model_len"
    assert "parallel" in asdict(b)


def test_validation_runners_skip_the_length_guard_at_any_size(tmp_path: Path) -> None:
    """The guard is chosen where the runner is built, so the per-device wrapper of a
    parallelism study needs no reaching into: a study's runners check prepared lengths,
    validation's do not (their fresh samples' text lengths are approximate)."""
    for search in ({}, {"parallelism": 2}):
        cfg, _ = config(worker={"kind": "sim"}, search=search)
        model, hw = model_of(cfg), get_hardware(cfg.hardware)  # type: ignore[attr-defined]
        study = make_runner(cfg, model, hw, tmp_path)  # type: ignore[arg-type]
        fresh = make_runner(cfg, model, hw, tmp_path, check_lengths=False)  # type: ignore[arg-type]
        assert isinstance(study, PerDevice) == bool(search)
        assert callable(study.check_prepared)  # type: ignore[attr-defined]
        assert fresh.check_prepared is None  # type: ignore[attr-defined]


def test_a_parallel_studys_plan_is_priced_at_a_size(tmp_path: Path) -> None:
    """Before any trial, at the largest size; once one has held the SLOs, at the size the
    later stages tune (docs/cost.md#3-the-plan-and-the-budget)."""
    cfg, text = par_config(n_trials=8)
    model = model_of(cfg)  # type: ignore[arg-type]
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)  # type: ignore[attr-defined]
    one = estimate(cfg, model, wl, 8, tp_size=1)  # type: ignore[arg-type]
    two = estimate(cfg, model, wl, 8)  # type: ignore[arg-type]
    assert two.tp_size == 2 and "at TP 2" in two.text and "at TP 1" in one.text
    # a trial of k devices holds k devices for a one-device level's span
    assert two.trial_gpu_s == pytest.approx(2 * one.trial_gpu_s)
    assert two.gpu_hours == pytest.approx(2 * one.gpu_hours)
    with Store.open(f"sqlite:///{tmp_path / 'e.db'}") as store:
        create_study(cfg, text, store)  # type: ignore[arg-type]
        assert any("at TP 2" in line for line in study_plan(store, "t"))
        run_study("t", store)
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        home = home_trial(study.get_trials(deepcopy=False))
        assert home is not None
        size = home.user_attrs.get("engine.tensor_parallel_size", home.params.get(TP_PARAM))
        assert any(f"at TP {size}" in line for line in study_plan(store, "t"))
