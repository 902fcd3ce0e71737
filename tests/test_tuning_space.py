"""Search space and scoring: pure logic on tiny in-memory inputs, and the ranges `create` stores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autotune.config import parse_config
from autotune.loadgen.level import LevelMetrics
from autotune.store import Store
from autotune.tuning.measure.scoring import (
    LevelScore,
    Slo,
    failed_trial_score,
    score_level,
    score_trial,
)
from autotune.tuning.run.create import create_study
from autotune.tuning.search.plan import cover_baseline, fixed_kv_bytes
from autotune.tuning.search.space import (
    MNBT_PARAM,
    PARAM_ORDER,
    SpaceBounds,
    max_model_len_candidates,
    mnbt_engine_value,
    mnbt_range,
    suggest,
)
from autotune.tuning.study_attrs import read_header


class FakeTrial:
    """Records the order of suggestions; answers from a hypothesis-drawn source."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.names: list[str] = []

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        self.names.append(name)
        return self.draw(st.sampled_from(list(choices)))

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        self.names.append(name)
        return float(self.draw(st.floats(low, high)))

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        self.names.append(name)
        return int(self.draw(st.integers(low, high)))


@st.composite
def bounds(draw: st.DrawFn) -> SpaceBounds:
    cands = tuple(sorted(set(draw(st.lists(st.integers(1, 64), min_size=1, max_size=3)))))
    mns_low = draw(st.integers(1, 64))
    return SpaceBounds(
        max_model_len_candidates=tuple(c * 256 for c in cands),
        mns_low=mns_low,
        mns_high=mns_low * draw(st.integers(1, 64)),
        mnbt_low=draw(st.sampled_from([1, 64, 256])),
        mnbt_high=draw(st.sampled_from([2048, 8192, 65536])),
        enable_chunked_prefill=draw(st.booleans()),
        extras=draw(st.sampled_from([(), (("enable_chunked_prefill", (True, False)),)])),
    )


@given(bounds(), st.data())
def test_every_suggestion_passes_vllms_validation_in_fixed_order(
    b: SpaceBounds, data: st.DataObject
) -> None:
    t = FakeTrial(data.draw)
    v = suggest(t, b)
    assert t.names[:4] == ["max_model_len", "gpu_memory_utilization", "max_num_seqs", MNBT_PARAM]
    chunked = v.extras.get("enable_chunked_prefill", b.enable_chunked_prefill)
    # vLLM SchedulerConfig rules (docs/vllm.md#43-config-validation)
    assert v.max_num_batched_tokens >= v.max_num_seqs >= 1
    if not chunked:
        assert v.max_num_batched_tokens >= v.max_model_len
    assert v.max_model_len in b.max_model_len_candidates
    assert b.util_low <= v.gpu_memory_utilization <= b.util_high
    assert b.mns_low <= v.max_num_seqs <= b.mns_high
    lo, hi = mnbt_range(b, v.max_model_len, v.max_num_seqs, chunked)
    assert lo <= v.max_num_batched_tokens <= hi
    assert list(v.engine_args())[:4] == list(PARAM_ORDER)


@given(st.integers(1, 10_000), st.integers(0, 100_000), st.integers(1, 200_000))
def test_the_suggestion_is_the_engine_value_whenever_it_is_valid(
    lo: int, span: int, raw: int
) -> None:
    hi = lo + span
    v = mnbt_engine_value(raw, lo, hi)
    assert lo <= v <= hi
    assert (v == raw) == (lo <= raw <= hi)
    if raw < lo:
        assert v == lo  # raised to the valid minimum, never somewhere else


def test_mnbt_engine_value_holds_when_max_num_seqs_moves() -> None:
    """The sampler's parameter is the engine value: fixed at 2048, it stays 2048 whatever
    max_num_seqs the stage tries (the fraction it replaced moved 6,271 -> 4,096)."""
    b = SpaceBounds(max_model_len_candidates=(4096,), mns_low=8, mns_high=1024)

    class Fixed:
        def __init__(self, mns: int) -> None:
            self.mns = mns

        def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
            return choices[0]

        def suggest_float(self, name: str, low: float, high: float, **_: Any) -> float:
            return low

        def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
            return self.mns if name == "max_num_seqs" else 2048

    assert {suggest(Fixed(m), b).max_num_batched_tokens for m in (8, 64, 512, 1024)} == {2048}
    assert suggest(Fixed(1024), replace(b, mnbt_low=256)).max_num_batched_tokens == 2048


def test_max_model_len_candidates_follow_the_length_distribution() -> None:
    c = max_model_len_candidates(2300, 2600, 3100, margin=0.1, model_max=32768)
    assert c == (2560, 3072, 3584)
    assert max_model_len_candidates(2300, 2600, 90000, margin=0.1, model_max=32768)[-1] == 32768


class _RecordingTPE(optuna.samplers.TPESampler):
    """Multivariate TPE that records which parameters it had to sample independently after
    its startup trials (the fallback Optuna takes for parameters outside the joint space)."""

    def __init__(self) -> None:
        super().__init__(seed=0, multivariate=True, n_startup_trials=5)
        self.fallbacks: set[str] = set()

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: optuna.distributions.BaseDistribution,
    ) -> Any:
        if trial.number >= 5:
            self.fallbacks.add(param_name)
        return super().sample_independent(study, trial, param_name, param_distribution)


def _independent_params(objective: Any) -> list[str]:
    sampler = _RecordingTPE()
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=20)
    joint = optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False))
    assert len(study.trials) == 20
    return [*sorted(sampler.fallbacks), f"joint={sorted(joint)}"]


def test_tpe_models_all_four_parameters_jointly() -> None:
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

    control = _independent_params(naive)
    assert "max_num_batched_tokens" in control and "max_num_batched_tokens" not in control[-1]
    got = _independent_params(ours)
    four = sorted(["gpu_memory_utilization", "max_model_len", MNBT_PARAM, "max_num_seqs"])
    assert got == [f"joint={four}"]


def test_score_level_normalized_margins_inclusive() -> None:
    slo = Slo(p99_ttft_ms=1000, p99_tpot_ms=50, max_error_rate=0.0, max_overlength_rate=0.1)
    ok = score_level(
        LevelMetrics(100, 0, p99_ttft_ms=1000.0, p99_tpot_ms=50.0, output_throughput=900.0), slo
    )
    assert ok.feasible and ok.violations["p99_ttft"] == 0.0 and ok.broken == ()
    bad = score_level(
        LevelMetrics(90, 10, over_length=5, p99_ttft_ms=1500.0, p99_tpot_ms=25.0), slo
    )
    assert not bad.feasible
    assert bad.violations["p99_ttft"] == pytest.approx(0.5)
    assert bad.violations["p99_tpot"] == pytest.approx(-0.5)
    # 5 of 100 failed for another reason than length; the 5 over-length ones count once,
    # in the over-length rate (docs/tuning.md#3-the-per-level-record)
    assert bad.violations["error_rate"] == pytest.approx(0.05)
    assert bad.violations["overlength_rate"] == pytest.approx(0.05 - 0.1)
    assert bad.texts == ["p99 TTFT 1,500 ms > 1,000 ms", "errors 5.0 % > 0 %"]
    offline = score_level(LevelMetrics(10, 0, output_throughput=5.0), slo, latency_slos=False)
    assert offline.feasible and offline.violations["p99_ttft"] == -1.0
    assert set(offline.violations) == {"p99_ttft", "p99_tpot", "error_rate", "overlength_rate"}


def test_score_trial_takes_the_highest_feasible_load() -> None:
    lv = [
        LevelScore(1.0, {"a": -0.1}, True, 100.0),
        LevelScore(2.0, {"a": -0.01}, True, 190.0),
        LevelScore(4.0, {"a": 0.3}, False, 250.0),
    ]
    s = score_trial(lv)
    assert s.feasible and s.objective == 190.0 and s.capacity_scale == 2.0
    none = score_trial(
        [LevelScore(1.0, {"a": 0.5}, False, 80.0), LevelScore(0.5, {"a": 0.2}, False, 40.0)]
    )
    assert not none.feasible and none.objective == 0.0 and none.constraints == {"a": 0.2}
    f = failed_trial_score()
    assert f.objective == 0 and all(v > 0 for v in f.constraints.values())


# -- ranges that contain the baseline (docs/tuning.md#8-the-staged-plan) ----------------------

_TINY_4GB: dict[str, Any] = {
    "name": "tiny",
    "model": {"name": "autotune/tiny-llama"},
    "hardware": "test-4GB",
    "workload": {
        "source": "synthetic",
        "num_prompts": 100,
        "input_len": 128,
        "output_len": 64,
        "arrival": "poisson",
        "rate": 10,
        "seed": 0,
    },
    "slo": {"p99_ttft_ms": 500, "p99_tpot_ms": 50},
    "strategy": {"capacity_levels": 4, "validate": {"enabled": False}},
}
_RANGES = {
    "gpu_memory_utilization": ("util_low", "util_high"),
    "max_num_seqs": ("mns_low", "mns_high"),
    "max_num_batched_tokens": ("mnbt_low", "mnbt_high"),
}


def _created(tmp_path: Path, **over: Any) -> tuple[SpaceBounds, dict[str, Any], list[str]]:
    """Create the study ``over`` makes of the tiny test-4GB config; its stored bounds,
    baseline and ``create``'s notes."""
    d = {**_TINY_4GB, **over}
    text = yaml.safe_dump(d)
    cfg = parse_config(text, "tiny.yaml")
    with Store.open(f"sqlite:///{tmp_path / 'c.db'}") as store:
        rec = create_study(cfg, text, store)
        study = optuna.load_study(study_name="tiny", storage=store.optuna_storage())
        header = read_header(study)
    return header.bounds, dict(header.baseline), list(rec.workload_profile.get("notes", []))


def _contains(b: SpaceBounds, baseline: dict[str, Any], param: str) -> bool:
    lo, hi = (getattr(b, a) for a in _RANGES[param])
    return bool(lo <= baseline[param] <= hi)


def test_a_real_workers_default_ranges_contain_the_baseline_on_test_4gb(tmp_path: Path) -> None:
    # the case: vLLM's defaults on test-4GB run max_num_seqs 256 while the peak
    # concurrency the simulator estimates for the synthetic profile set the range to 8..16
    b, base, notes = _created(tmp_path, worker={"kind": "vllm"})
    assert base["max_num_seqs"] == 256
    for param in _RANGES:
        assert _contains(b, base, param), (param, b, base)
    assert base["max_model_len"] in b.max_model_len_candidates
    assert b.mns_low == 8 and b.mns_high == 256  # extended to the baseline, no further
    assert notes == []


def test_a_simulated_workers_peak_cap_is_kept_and_said(tmp_path: Path) -> None:
    # the simulator serves the trials: the engine never holds more than the peak it
    # simulated, so the values up to the baseline's 256 act as the ceiling does
    b, base, notes = _created(tmp_path, worker={"kind": "sim-virtual"})
    assert b.mns_high == 16 and not _contains(b, base, "max_num_seqs")
    assert _contains(b, base, "gpu_memory_utilization")
    assert _contains(b, base, "max_num_batched_tokens")
    [note] = notes
    assert note.startswith("max_num_seqs 8..16 excludes the baseline's 256: the engine held")
    assert "does not bind" in note


def test_an_explicit_range_that_excludes_the_baseline_is_kept_with_a_note(tmp_path: Path) -> None:
    search = {"max_num_seqs": {"low": 8, "high": 16}, "max_num_batched_tokens": {"low": 4096}}
    b, _, notes = _created(tmp_path, worker={"kind": "vllm"}, search=search)
    assert (b.mns_low, b.mns_high, b.mnbt_low) == (8, 16, 4096)  # the user's, untouched
    assert notes == [
        "search.max_num_seqs 8..16, set in the config, excludes the baseline's 256: the "
        "baseline still runs at 256; the max_num_seqs stages search 8..16 only",
        "search.max_num_batched_tokens 4096..65536, set in the config, excludes the "
        "baseline's 2048: the baseline still runs at 2048; the max_num_batched_tokens stages "
        "search 4096..65536 only",
    ]


@given(
    util=st.sampled_from([0.5, 0.85, 0.99]),
    mns=st.sampled_from([4, 64, 2048]),
    mnbt=st.sampled_from([64, 2048, 131072]),
    kind=st.sampled_from(["vllm", "sim-virtual"]),
    peak=st.sampled_from([0, 5, 300]),
)
def test_every_range_contains_the_baseline_or_a_note_names_it(
    util: float, mns: int, mnbt: int, kind: str, peak: int
) -> None:
    cfg = parse_config(yaml.safe_dump({**_TINY_4GB, "worker": {"kind": kind}}), "t.yaml")
    b = SpaceBounds((512,), mns_high=max(16, 2 * peak) if peak else 1024)
    base = {"gpu_memory_utilization": util, "max_num_seqs": mns, "max_num_batched_tokens": mnbt}
    out, notes = cover_baseline(b, base, cfg, peak)
    for param in _RANGES:
        named = [n for n in notes if n.startswith(param)]
        assert _contains(out, base, param) != bool(named), (param, out, notes)
    # only a max_num_seqs ceiling a simulated worker's peak sets stays below the baseline
    assert all(n.startswith("max_num_seqs") for n in notes)
    assert bool(notes) == (kind == "sim-virtual" and peak > 0 and mns > b.mns_high)
    # a range is only ever widened, never narrowed
    assert out.mns_low <= b.mns_low and out.mns_high >= b.mns_high
    assert out.util_low <= b.util_low and out.util_high >= b.util_high


def test_a_kv_size_in_bytes_is_read_in_any_spelling_and_zero_is_unset() -> None:
    assert fixed_kv_bytes({"kv_cache_memory_bytes": 2**26}) == "67108864"
    assert fixed_kv_bytes({"--kv-cache-memory-bytes": "64M", "enforce_eager": True}) == "64M"
    # vLLM tests the value's truth: 0 leaves the fraction in charge
    assert fixed_kv_bytes({"kv_cache_memory_bytes": 0}) is None
    assert fixed_kv_bytes({"kv_cache_memory_bytes": "0"}) is None
    assert fixed_kv_bytes({"enforce_eager": True}) is None
