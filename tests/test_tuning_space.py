"""Search space and scoring: pure logic on tiny in-memory inputs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.tuning.scoring import (
    LevelScore,
    Slo,
    failed_trial_score,
    next_scale,
    score_level,
    score_trial,
)
from autotune.tuning.space import (
    MNBT_PARAM,
    PARAM_ORDER,
    SpaceBounds,
    max_model_len_candidates,
    mnbt_from_unit,
    mnbt_range,
    suggest,
    unit_from_mnbt,
)


class FakeTrial:
    """Records the order of suggestions; answers from a hypothesis-drawn source."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.names: list[str] = []

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        self.names.append(name)
        return self.draw(st.sampled_from(list(choices)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        self.names.append(name)
        return float(self.draw(st.floats(low, high)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        self.names.append(name)
        return int(self.draw(st.integers(low, high)))


@st.composite
def bounds(draw: st.DrawFn) -> SpaceBounds:
    cands = tuple(sorted(set(draw(st.lists(st.integers(1, 64), min_size=1, max_size=3)))))
    mns_low = draw(st.integers(1, 64))
    return SpaceBounds(
        max_model_len_candidates=tuple(c * 256 for c in cands),
        mns_low=mns_low, mns_high=mns_low * draw(st.integers(1, 64)),
        mnbt_low=draw(st.sampled_from([1, 64, 256])),
        mnbt_high=draw(st.sampled_from([2048, 8192, 65536])),
        enable_chunked_prefill=draw(st.booleans()),
        extras=draw(st.sampled_from([(), (("enable_chunked_prefill", (True, False)),)])),
    )


@given(bounds(), st.data())
def test_every_suggestion_passes_vllms_validation_in_fixed_order(b: SpaceBounds,
                                                                 data: st.DataObject) -> None:
    t = FakeTrial(data.draw)
    v = suggest(t, b)
    assert t.names[:4] == ["max_model_len", "gpu_memory_utilization", "max_num_seqs",
                           MNBT_PARAM]
    chunked = v.extras.get("enable_chunked_prefill", b.enable_chunked_prefill)
    # vLLM SchedulerConfig rules (vllm.md §4.3)
    assert v.max_num_batched_tokens >= v.max_num_seqs >= 1
    if not chunked:
        assert v.max_num_batched_tokens >= v.max_model_len
    assert v.max_model_len in b.max_model_len_candidates
    assert b.util_low <= v.gpu_memory_utilization <= b.util_high
    assert b.mns_low <= v.max_num_seqs <= b.mns_high
    lo, hi = mnbt_range(b, v.max_model_len, v.max_num_seqs, chunked)
    assert lo <= v.max_num_batched_tokens <= hi
    assert list(v.engine_args())[:4] == list(PARAM_ORDER)


@given(st.integers(1, 10_000), st.integers(1, 100_000), st.floats(0, 1))
def test_unit_fraction_round_trips(lo: int, span: int, u: float) -> None:
    hi = lo + span
    v = mnbt_from_unit(u, lo, hi)
    assert lo <= v <= hi
    assert abs(mnbt_from_unit(unit_from_mnbt(v, lo, hi), lo, hi) - v) <= 1


def test_max_model_len_candidates_follow_the_length_distribution() -> None:
    c = max_model_len_candidates(2300, 2600, 3100, margin=0.1, model_max=32768)
    assert c == (2560, 3072, 3584)
    assert max_model_len_candidates(2300, 2600, 90000, margin=0.1, model_max=32768)[-1] == 32768


def _independent_warnings(objective: Any, caplog: pytest.LogCaptureFixture) -> list[str]:
    sampler = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=5,
                                         warn_independent_sampling=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    optuna.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING, logger="optuna"):
            study.optimize(objective, n_trials=20)
    finally:
        optuna.logging.disable_propagation()
    joint = optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False))
    assert len(study.trials) == 20
    return [r.getMessage() for r in caplog.records if "independent" in r.getMessage()] + [
        f"joint={sorted(joint)}"]


def test_tpe_models_all_four_parameters_jointly(caplog: pytest.LogCaptureFixture) -> None:
    """Fixed distributions: multivariate TPE keeps all four in its joint search space and
    never falls back to independent sampling (checked against a control that samples
    max_num_batched_tokens on a range that depends on max_num_seqs)."""
    b = SpaceBounds(max_model_len_candidates=(2048, 4096), mns_low=8, mns_high=512)

    def ours(trial: optuna.Trial) -> float:
        v = suggest(trial, b)
        return -abs(v.max_num_seqs - 100) - abs(v.max_num_batched_tokens - 4096) / 100

    def naive(trial: optuna.Trial) -> float:
        trial.suggest_categorical("max_model_len", [2048, 4096])
        trial.suggest_float("gpu_memory_utilization", 0.8, 0.95, step=0.01)
        mns = trial.suggest_int("max_num_seqs", 8, 512, log=True)
        mnbt = trial.suggest_int("max_num_batched_tokens", max(256, mns), 65536, log=True)
        return -abs(mns - 100) - abs(mnbt - 4096) / 100

    control = _independent_warnings(naive, caplog)
    assert len(control) > 1 and "max_num_batched_tokens" not in control[-1]
    caplog.clear()
    got = _independent_warnings(ours, caplog)
    four = sorted(["gpu_memory_utilization", "max_model_len", MNBT_PARAM, "max_num_seqs"])
    assert got == [f"joint={four}"]


def test_score_level_normalized_margins_inclusive() -> None:
    slo = Slo(p99_ttft_ms=1000, p99_tpot_ms=50, max_error_rate=0.0, max_overlength_rate=0.1)
    ok = score_level({"completed": 100, "failed": 0, "p99_ttft_ms": 1000.0,
                      "p99_tpot_ms": 50.0, "output_throughput": 900.0}, slo)
    assert ok.feasible and ok.violations["p99_ttft"] == 0.0
    bad = score_level({"completed": 90, "failed": 10, "over_length_rejections": 5,
                       "p99_ttft_ms": 1500.0, "p99_tpot_ms": 25.0}, slo)
    assert not bad.feasible
    assert bad.violations["p99_ttft"] == pytest.approx(0.5)
    assert bad.violations["p99_tpot"] == pytest.approx(-0.5)
    assert bad.violations["error_rate"] == pytest.approx(0.05)
    assert bad.violations["overlength_rate"] == pytest.approx(0.05 - 0.1)
    offline = score_level({"completed": 10, "failed": 0, "output_throughput": 5.0}, slo,
                          latency_slos=False)
    assert offline.feasible and offline.violations["p99_ttft"] == -1.0
    assert set(offline.violations) == {"p99_ttft", "p99_tpot", "error_rate", "overlength_rate"}


def test_score_trial_takes_the_highest_feasible_load() -> None:
    lv = [LevelScore(1.0, {"a": -0.1}, True, 100.0), LevelScore(2.0, {"a": -0.01}, True, 190.0),
          LevelScore(4.0, {"a": 0.3}, False, 250.0)]
    s = score_trial(lv)
    assert s.feasible and s.objective == 190.0 and s.capacity_scale == 2.0
    none = score_trial([LevelScore(1.0, {"a": 0.5}, False, 80.0),
                        LevelScore(0.5, {"a": 0.2}, False, 40.0)])
    assert not none.feasible and none.objective == 0.0 and none.constraints == {"a": 0.2}
    f = failed_trial_score()
    assert f.objective == 0 and all(v > 0 for v in f.constraints.values())


def test_bracketed_capacity_search() -> None:
    feasible_below = 2.7  # pretend capacity

    def run(budget: int) -> list[tuple[float, bool]]:
        h: list[tuple[float, bool]] = []
        while (s := next_scale(h, low=0.25, high=8.0, budget=budget)) is not None:
            h.append((s, s <= feasible_below))
        return h

    h = run(6)
    assert [s for s, _ in h[:3]] == [1.0, 2.0, 4.0]
    best = max(s for s, f in h if f)
    assert 2.0 <= best <= feasible_below and len(h) <= 6
    # never feasible: halves down to the floor and stops
    h2: list[tuple[float, bool]] = []
    while (s := next_scale(h2, low=0.25, high=8.0, budget=10)) is not None:
        h2.append((s, False))
    assert [s for s, _ in h2] == [1.0, 0.5, 0.25]
