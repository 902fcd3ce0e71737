"""The pieces behind the report and the dashboard, on small inputs: stepped floats stored
as their decimals, enqueued engine args as one attribute each, a level's time series, the
gain's wording, the Pareto front, the stage history."""

from __future__ import annotations

import dataclasses

import optuna

from autotune.report.recommend import Recommendation, gain_text
from autotune.report.study_view import pareto_front
from autotune.report.tables import short_stage
from autotune.store import TrialRecord
from autotune.telemetry.stats import SERIES_BINS, downsample
from autotune.tuning.attrs import engine_attrs, enqueue_attrs, enqueued_engine_args
from autotune.tuning.measure.interval import CandidateSummary, Interval, ValidationSummary
from autotune.tuning.search.rounding import TidySteps


def _quiet_study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize")


def test_stepped_floats_are_stored_as_their_decimals() -> None:
    plain, tidy = _quiet_study(), _quiet_study()
    plain.sampler = optuna.samplers.RandomSampler(seed=3)
    tidy.sampler = TidySteps(optuna.samplers.RandomSampler(seed=3))
    for study in (plain, tidy):
        for _ in range(40):
            t = study.ask()
            t.suggest_float("u", 0.80, 0.95, step=0.01)
            t.suggest_float("free", 0.0, 1.0)
            study.tell(t, 1.0)
    raw = [t.params["u"] for t in plain.trials]
    kept = [t.params["u"] for t in tidy.trials]
    assert any(len(repr(v)) > 6 for v in raw)  # 0.8500000000000001 and the like
    assert all(len(repr(v)) <= 4 for v in kept)  # 0.85
    assert kept == [round(v, 2) for v in raw]  # the same draws, only rounded
    # an unstepped float is left alone
    assert [t.params["free"] for t in tidy.trials] == [t.params["free"] for t in plain.trials]


def test_enqueued_engine_args_are_one_attribute_each_and_read_back() -> None:
    args = {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.8500000000000001,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "enable_chunked_prefill": False,
        "kv_transfer_config": None,
        "compilation_config": {"level": 3},
    }
    attrs = enqueue_attrs("baseline", args)
    assert attrs == {
        "label": "baseline",
        "engine.max_model_len": 4096,
        "engine.gpu_memory_utilization": 0.85,
        "engine.max_num_seqs": 64,
        "engine.max_num_batched_tokens": 2048,
        "engine.enable_chunked_prefill": False,
        "engine.compilation_config.level": 3,
    }
    assert all(not isinstance(v, dict | list) for v in attrs.values())
    back = enqueued_engine_args(attrs)
    assert back == {
        **{k: v for k, v in args.items() if v is not None},
        "gpu_memory_utilization": 0.85,
    }
    # a study created before: one mapping; a sampled trial: nothing enqueued
    assert enqueued_engine_args({"label": "baseline", "engine_args": {"max_num_seqs": 8}}) == {
        "max_num_seqs": 8
    }
    assert enqueued_engine_args(engine_attrs(args)) is None


def test_a_level_series_has_bin_means_and_the_preemption_count() -> None:
    t = [i * 0.5 for i in range(1, 1001)]  # 500 s of samples every 0.5 s
    running = [0.0 if x <= 250 else 10.0 for x in t]  # a step half way
    preempt = [float(i // 100) for i in range(1000)]  # one more every 50 s
    s = downsample(t, {"running": running, "preemptions": preempt}, 0.0)
    assert s is not None
    assert len(s["t"]) == SERIES_BINS and 490 < s["t"][-1] < 500  # the last bin's mean time
    assert s["running"][:29] == [0.0] * 29 and s["running"][31:] == [10.0] * 29
    assert 0 < s["running"][29] + s["running"][30] < 20  # the bins around the step mix both
    assert s["preemptions"][-1] == 9.0 and s["preemptions"] == sorted(s["preemptions"])
    assert downsample([], {"running": []}, 0.0) is None
    few = downsample([1.0, 2.0, 3.0], {"kv_usage": [0.1, 0.2, 0.3]}, 0.0)
    assert few is not None and few["kv_usage"] == [0.1, 0.2, 0.3]  # empty bins left out


def _trial(
    number: int, objective: float, feasible: bool = True, stage: str = "joint"
) -> TrialRecord:
    return TrialRecord(
        study_name="s",
        optuna_trial_number=number,
        stage=stage,
        state="COMPLETE",
        params={},
        engine_args={},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
        objective=objective,
        feasible=feasible,
    )


def _summary(iv: Interval, verdict: str) -> ValidationSummary:
    cand = CandidateSummary(5, 3, 3, 1.1, iv)
    chosen = 5 if verdict == "recommend" else None
    return ValidationSummary(
        "slo-capacity",
        "capacity",
        0.95,
        3,
        6,
        6,
        0,
        3,
        0.0,
        True,
        0.01,
        (cand,),
        verdict,
        chosen,
        5,  # type: ignore[arg-type]
    )


def test_the_gain_says_whether_it_was_validated() -> None:
    base, best = _trial(0, 1000.0, stage="baseline"), _trial(5, 1143.0)
    rec = Recommendation(best, base, "vllm serve m", {})
    assert gain_text(rec) == "+14.3 % (not validated)"
    iv = Interval(9.4, 7.1, 11.8, 3, 0.95, 1.0, 1.0)
    rec.validation = _summary(iv, "recommend")
    assert gain_text(rec) == "+9.4 % (95 % CI +7.1 … +11.8 %, 3 paired runs)"
    rec.validation = _summary(Interval(0.4, -1.2, 2.0, 3, 0.95, 1.0, 1.0), "keep")
    assert gain_text(rec).startswith("keep your current config: no candidate beats it beyond")
    rec.validation = dataclasses.replace(_summary(iv, "recommend"), runs_done=2)
    assert gain_text(rec) == "+14.3 % (not validated)"  # an incomplete phase validates nothing
    assert gain_text(Recommendation(best, None, "", {})) == "n/a (no baseline trial in this study)"
    failed = _trial(0, 0.0, feasible=False, stage="baseline")
    failed.failure_class = "NO_KV_MEMORY"
    assert gain_text(Recommendation(best, failed, "", {})).startswith("n/a (baseline trial 0")


def test_the_pareto_front_keeps_only_undominated_points() -> None:
    pts = [(100.0, 500.0, 0), (200.0, 800.0, 1), (150.0, 400.0, 2), (300.0, 790.0, 3)]
    assert pareto_front(pts) == [(100.0, 500.0, 0), (200.0, 800.0, 1)]
    assert pareto_front([]) == []


def test_the_narrow_table_shortens_stage_labels_and_keeps_the_pass() -> None:
    assert short_stage("max_num_batched_tokens") == "batch_tok"
    assert short_stage("max_num_batched_tokens.2") == "batch_tok.2"
    assert short_stage("max_num_seqs.3") == "num_seqs.3"
    assert short_stage("joint") == "joint" and short_stage("enqueue-0") == "enqueue-0"
