"""The staged plan (issue 12): over-length screening before any launch, the memory stage
decided by the baseline's telemetry, the line search of a numeric stage, the fixed-rate
ranking rule and independent sampler seeds. Pure logic on tiny inputs, then two studies on
sim-virtual."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from support.studies import BASE, config

from autotune.config import StrategyConfig
from autotune.errors import ConfigError
from autotune.store import Store
from autotune.tuning.measure.scoring import Slo, binding_slo, trial_rank
from autotune.tuning.run.controller import run_study, sampler_seed
from autotune.tuning.run.create import create_study, validation_lengths
from autotune.tuning.run.status import study_plan
from autotune.tuning.search.linesearch import next_on_line
from autotune.tuning.search.plan import (
    FreshLengths,
    model_of,
    overlength_rate,
    screen_max_model_len,
)
from autotune.tuning.search.space import PARAM_ORDER, SpaceBounds, suggest
from autotune.tuning.search.stages import (
    KV_NOT_BOTTLENECK,
    memory_evidence,
    stage_param,
    stage_plan,
)
from autotune.tuning.search.strategy import POLISH, sampler_for
from autotune.workload.build import study_workload

# -- over-length screening --------------------------------------------------------------------


def test_overlength_rate_counts_refused_and_cut_requests() -> None:
    prompt, output = [100, 200, 300, 400], [50, 50, 50, 50]
    # 300: the 300-token prompt is refused (it reaches max_model_len), 400 too; 200+50 > 249
    assert overlength_rate(300, prompt, output) == 0.5
    assert overlength_rate(249, prompt, output) == 0.75
    assert overlength_rate(450, prompt, output) == 0.0
    assert overlength_rate(449, prompt, output) == 0.25


def test_screening_drops_candidates_over_the_limit_and_says_why() -> None:
    prompt = [1000] * 95 + [3000] * 5
    output = [100] * 100
    s = screen_max_model_len((1280, 2048, 3328), prompt, output, limit=0.01)
    assert s.kept == (3328,) and s.dropped == (1280, 2048)
    assert s.rates[2048] == pytest.approx(0.05)
    d = s.to_dict()["dropped"]
    assert d[0]["max_model_len"] == 1280 and "do not fit" in d[0]["why"]
    with pytest.raises(ConfigError, match=r"search\.max_model_len.*3100"):
        screen_max_model_len((1280, 2048), prompt, output, limit=0.01)


def test_candidates_that_break_the_overlength_limit_are_never_launched(tmp_path: Path) -> None:
    cfg, text = config(
        search={"max_model_len": {"candidates": [640, 1024, 4096]}},
        strategy={"n_trials": 4, "trials_per_stage": 1, "capacity_levels": 3},
    )
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        plan = study_plan(store, "t")
        run_study("t", store)
        launched = {t.engine_args["max_model_len"] for t in store.trials("t")}
    lens = [r for r in plan if "dropped before any launch" in r]
    dropped = [int(r.split()[1]) for r in lens]
    assert dropped and not launched & set(dropped)
    assert launched <= {640, 1024, 4096} - set(dropped)


def test_screening_drops_what_validations_fresh_samples_would_refuse() -> None:
    # 1 of 100 workload requests does not fit 2048 (at the 1 % limit); 3 of 200 of the
    # fresh samples' do (1.5 %): validation would refuse 2048 whatever it gained. 1280 breaks
    # the limit on the workload itself (2 of 100).
    prompt, output = [1000] * 98 + [1500, 3000], [100] * 100
    fresh = FreshLengths(tuple([1000] * 197 + [3000] * 3), tuple([100] * 200), samples=2)
    s = screen_max_model_len((1280, 2048, 3328), prompt, output, 0.01, fresh)
    assert s.kept == (3328,) and s.dropped == (1280, 2048)
    assert s.fresh_rates[2048] == pytest.approx(0.015) and s.rates[2048] == pytest.approx(0.01)
    d1280, d = s.to_dict()["dropped"]
    assert d1280["why"] == "2.00% of the workload's requests do not fit (limit 1.00%)"
    assert d["fresh_overlength_rate"] == pytest.approx(0.015)
    assert d["why"] == (
        "1.50% of the 200 requests of validation's 2 fresh samples do not fit (limit 1.00%; "
        "1.00% of the workload's own), so validation would refuse it"
    )
    # without the fresh samples (validation off) the workload alone decides, as before
    assert screen_max_model_len((1280, 2048, 3328), prompt, output, 0.01).kept == (2048, 3328)
    # the longest candidate left, the baseline's, stays whatever the fresh samples say
    worse = FreshLengths(tuple([3400] * 10 + [1000] * 190), tuple([100] * 200), samples=2)
    assert screen_max_model_len((2048, 3328), prompt, output, 0.01, worse).kept == (3328,)
    assert screen_max_model_len((3328,), prompt, output, 0.01, worse).kept == (3328,)


def _threshold_between(
    study: tuple[list[int], list[int]], fresh: FreshLengths, limit: float
) -> int | None:
    """A max_model_len the study's lengths fit within ``limit`` but the fresh ones do not."""
    totals = {p + o for p, o in zip(*study, strict=True)}
    for c in sorted(totals | {p + o for p, o in zip(fresh.prompt, fresh.output, strict=True)}):
        if overlength_rate(c, *study) <= limit < overlength_rate(c, fresh.prompt, fresh.output):
            return c
    return None


def test_create_screens_candidates_on_validations_own_samples(tmp_path: Path) -> None:
    workload = {**BASE["workload"], "input_len": 700, "output_len": 300}
    cfg, _ = config(workload=workload)
    model = model_of(cfg)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    fresh = validation_lengths(cfg, model.vocab_size)
    assert fresh is not None and fresh.samples == cfg.validation_repeats == 5
    study = [r.prompt_len for r in wl.requests], [r.output_len for r in wl.requests]
    limit = 0.02
    cut = _threshold_between(study, fresh, limit)
    assert cut is not None
    pairs = [*zip(fresh.prompt, fresh.output, strict=True), *zip(*study, strict=True)]
    top = max(p + o for p, o in pairs) + 1  # every request fits: the baseline's candidate
    search = {"max_model_len": {"candidates": [cut, top]}}
    slo = {**BASE["slo"], "max_overlength_rate": limit}
    cfg, text = config(workload=workload, search=search, slo=slo)
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        plan = study_plan(store, "t")
    assert any(
        line.startswith(f"max_model_len {cut} dropped before any launch: ")
        and "fresh samples do not fit" in line
        for line in plan
    )
    # validation off, on the same workload: nothing refuses it later, so it stays a candidate
    off = {**BASE["strategy"], "validate": {"enabled": False}}
    cfg, text = config(workload=workload, search=search, slo=slo, strategy=off)
    assert validation_lengths(cfg, model.vocab_size) is None
    with Store.open(f"sqlite:///{tmp_path / 'b.db'}") as store:
        create_study(cfg, text, store)
        assert not any("dropped" in line for line in study_plan(store, "t"))


# -- the memory stage ---------------------------------------------------------------------------


def _trial(number: int, attrs: dict[str, Any], value: float = 100.0) -> optuna.trial.FrozenTrial:
    t = create_trial(
        params={"gpu_memory_utilization": 0.9},
        distributions={"gpu_memory_utilization": FloatDistribution(0.8, 0.95, step=0.01)},
        value=value,
        user_attrs=attrs,
        state=TrialState.COMPLETE,
    )
    t.number = number
    return t


B = SpaceBounds(max_model_len_candidates=(2048, 4096))
ST = StrategyConfig(trials_per_stage=4, joint_refinement=3, n_trials=30)


def _plan(attrs: dict[str, Any]) -> list[Any]:
    base = _trial(0, {"label": "baseline", "stage": "baseline", **attrs})
    return stage_plan([base], ST, B)


def _budgets(attrs: dict[str, Any]) -> dict[str, int]:
    return {s.name: s.budget for s in _plan(attrs)}


@given(
    kv=st.floats(0.0, 1.0),
    pre=st.sampled_from([0.0, 1.0, 40.0]),
    kind=st.sampled_from(["headroom", "token-budget-bound", "concurrency-capped"]),
    binding=st.sampled_from([None, "p99_ttft", "p99_tpot"]),
)
def test_memory_stage_is_skipped_exactly_when_the_baseline_says_so(
    kv: float, pre: float, kind: str, binding: str | None
) -> None:
    attrs = {"kv_usage_peak": kv, "preemptions": pre, "levels": 5, "diagnosis": kind}
    plan = _plan(attrs | ({"binding_slo": binding} if binding else {}))
    b = {s.name: s.budget for s in plan}
    skip = kv < KV_NOT_BOTTLENECK and pre == 0
    assert b["gpu_memory_utilization"] == (0 if skip else 4)
    # the fixed order first, the joint refinement, max_model_len again at the tuned
    # concurrency (one other candidate), then the coordinate passes fill the study
    names = [s.name for s in plan]
    assert names[:6] == [*PARAM_ORDER, "joint", "max_model_len.2"]
    assert b["max_model_len.2"] == 1
    assert sum(b.values()) == 30 - 1  # every trial but the baseline's is planned: none lost
    passes = names[6:]
    assert passes and all(stage_param(n)[1] >= 2 for n in passes)
    # each pass revisits the pair the diagnosis points at, the token budget first when the
    # baseline is token-budget-bound or p99 TPOT binds its capacity
    budget_first = kind == "token-budget-bound" or binding == "p99_tpot"
    first = "max_num_batched_tokens" if budget_first else "max_num_seqs"
    assert stage_param(passes[0]) == (first, 2)
    assert {stage_param(n)[0] for n in passes} == {"max_num_seqs", "max_num_batched_tokens"}


def test_memory_stage_kept_without_telemetry_or_before_the_baseline() -> None:
    assert _budgets({"levels": 5})["gpu_memory_utilization"] == 4  # no KV evidence
    running = _trial(0, {"label": "baseline"})
    running.state, running.value = TrialState.RUNNING, None
    plan = {s.name: s.budget for s in stage_plan([running], ST, B)}
    assert plan["gpu_memory_utilization"] == 4  # provisional until the baseline is done


def test_memory_evidence_needs_every_level() -> None:
    full = [{"evidence": {"kv_usage_max": 0.5, "preemptions": 0.0}}] * 3
    ev = memory_evidence(full)
    assert (ev.kv_peak, ev.preemptions, ev.levels) == (0.5, 0.0, 3)
    assert ev.bottleneck()[0] is False
    # one level without KV telemetry: nothing can be claimed about every level
    assert memory_evidence([*full, {"evidence": {}}]).kv_peak is None
    assert memory_evidence([*full, None]).bottleneck()[0] is None
    hot = memory_evidence([{"evidence": {"kv_usage_max": 0.97, "preemptions": 12.0}}])
    assert hot.bottleneck()[0] is True


# -- the line search ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    peak=st.floats(8, 512),
    budget=st.integers(2, 10),
    start=st.integers(8, 512),
)
def test_line_search_never_repeats_and_closes_in_on_a_single_peak(
    peak: float, budget: int, start: int
) -> None:
    def f(x: float) -> float:
        return float(-abs(np.log(x) - np.log(peak)))

    pts: list[tuple[float, float | None]] = [(float(start), f(start))]
    for _ in range(budget):
        x = next_on_line(pts, 8, 512, log=True, step=1, n_coarse=max(2, budget // 2))
        if x is None:
            break
        assert x not in {p for p, _ in pts} and 8 <= x <= 512 and x == int(x)
        pts.append((x, f(x)))
    best = max(pts, key=lambda p: p[1] or -1e9)[0]
    # a log-spaced bracket over 8..512 halved (budget - coarse) times
    coarse = max(2, budget // 2)
    width = np.log(64) / coarse
    assert abs(np.log(best) - np.log(peak)) <= width + 1e-9


def test_line_search_counts_running_trials_as_tried() -> None:
    first = next_on_line([(100.0, 1.0)], 0.8, 0.95, log=False, step=0.01, n_coarse=2)
    assert first is not None
    second = next_on_line(
        [(100.0, 1.0), (first, None)], 0.8, 0.95, log=False, step=0.01, n_coarse=2
    )
    assert second not in (None, first)
    assert next_on_line([(0.9, 1.0)], 0.9, 0.9, log=False, step=0.01, n_coarse=2) is None


def test_a_line_that_found_no_rise_tries_its_end_before_narrowing_in() -> None:
    """``end`` (value, score): after the grid, the value is tried when nothing on the line
    beats the score by more than the tolerance; a line that rose narrows in as before."""
    flat: list[tuple[float, float | None]] = [(8192.0, 1.0), (645.0, -0.5), (26008.0, 1.0)]
    kw: dict[str, Any] = {"log": True, "step": 1, "n_coarse": 3}
    assert next_on_line(flat, 256, 65536, **kw, end=(256, 1.0)) == 256
    assert next_on_line(flat, 256, 65536, **kw) != 256  # without it: beside the plateau
    rose = [(8192.0, 1.0), (645.0, 1.2), (26008.0, -0.5)]
    assert next_on_line(rose, 256, 65536, **kw, end=(256, 1.0)) == next_on_line(
        rose, 256, 65536, **kw
    )
    tried = [*flat, (256.0, -0.5)]  # tried once, never again
    assert next_on_line(tried, 256, 65536, **kw, end=(256, 1.0)) not in (None, 256)


# -- fixed-rate ranking ---------------------------------------------------------------------------


def test_fixed_rate_ranks_by_the_worst_slo_margin_then_throughput() -> None:
    slo = Slo(p99_ttft_ms=500.0, p99_tpot_ms=50.0)
    # the real-vLLM case of issue 12: 84 ms beats 407 ms whatever the throughput's noise says
    fast = trial_rank("fixed-rate", slo, 1000.0, 84.0, 20.0)
    slow = trial_rank("fixed-rate", slo, 1003.0, 407.0, 20.0)
    assert fast > slow
    # the worst margin is the max over the set SLOs: TPOT at 0.9 of its SLO dominates here
    assert trial_rank("fixed-rate", slo, 1.0, 84.0, 45.0)[0] == pytest.approx(1 / 0.9)
    # equal margins: throughput decides
    assert trial_rank("fixed-rate", slo, 1001.0, 250.0, 10.0) > trial_rank(
        "fixed-rate", slo, 1000.0, 250.0, 10.0
    )
    # no latency SLO set: throughput alone; other modes: the objective
    assert trial_rank("fixed-rate", Slo(), 7.0, 84.0, 20.0) == (0.0, 7.0)
    assert trial_rank("slo-capacity", slo, 7.0, 400.0, 45.0) == (7.0, 0.0)


def test_fixed_rate_study_recommends_the_widest_margin(tmp_path: Path) -> None:
    from autotune.report.recommend import recommend
    from autotune.tuning.measure.scoring import record_rank
    from autotune.tuning.run.create import load_study_config

    cfg, text = config(mode="fixed-rate", strategy={"name": "random", "n_trials": 5})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        rec = create_study(cfg, text, store)
        run_study("t", store)
        trials = [t for t in store.trials("t") if t.state == "COMPLETE"]
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        r = recommend(load_study_config(rec), trials)
    slo = Slo.of(cfg.slo)
    feasible = [t for t in trials if t.feasible]
    assert feasible and r is not None
    widest = max(feasible, key=lambda t: record_rank("fixed-rate", slo, t))
    assert r.trial.optuna_trial_number == widest.optuna_trial_number
    # Optuna maximises the same headroom: 1 / worst margin
    by_number = {t.number: t for t in study.trials}
    for t in feasible:
        assert by_number[t.optuna_trial_number].value == pytest.approx(
            record_rank("fixed-rate", slo, t)[0]
        )


# -- seeds ---------------------------------------------------------------------------------


def test_study_seeds_give_independent_sampler_sequences() -> None:
    s0 = [sampler_seed(0, n) for n in range(200)]
    s1 = [sampler_seed(1, n) for n in range(200)]
    assert len(set(s0)) == 200  # a fresh seed per trial
    # not a shifted copy: seed + n would make s1[n] == s0[n + 1]
    assert not set(s0) & set(s1)
    draws0 = np.array([np.random.default_rng(s).random() for s in s0])
    draws1 = np.array([np.random.default_rng(s).random() for s in s1])
    assert abs(np.corrcoef(draws0, draws1)[0, 1]) < 0.2
    assert json.dumps(s0[:3]) == json.dumps([sampler_seed(0, n) for n in range(3)])


# -- the memory stage's top, and what the joint refinement holds ---------------------------------

_HOT = {"kv_usage_peak": 0.97, "preemptions": 12.0, "levels": 5, "diagnosis": "kv-bound"}
_DISTS = {
    "max_model_len": CategoricalDistribution([2048, 4096]),
    "gpu_memory_utilization": FloatDistribution(0.8, 0.95, step=0.01),
    "max_num_seqs": IntDistribution(8, 512, log=True),
    "max_num_batched_tokens": IntDistribution(64, 65536, log=True),
}


def _full(number: int, stage: str, util: float, mns: int, value: float) -> Any:
    """A complete feasible trial over all four parameters (the stages read every one); the
    baseline's telemetry says memory is the bottleneck."""
    params = {
        "max_model_len": 4096,
        "gpu_memory_utilization": util,
        "max_num_seqs": mns,
        "max_num_batched_tokens": 2048,
    }
    attrs = {"stage": stage, **({"label": "baseline", **_HOT} if stage == "baseline" else {})}
    t = create_trial(
        params=params, distributions=_DISTS, value=value, user_attrs=attrs, constraints={"c0": -1.0}
    )
    t.number = number
    return t


def _ask(stage: str, trials: list[Any], strategy: StrategyConfig, seed: int = 7) -> Any:
    """The engine values the stage's sampler suggests next (in the fixed order)."""
    study = optuna.create_study(direction="maximize")
    for t in trials:
        study.add_trial(t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks PartialFixedSampler experimental
        study.sampler = sampler_for(stage, study.get_trials(), B, seed, strategy)
        return suggest(study.ask(), B)


def test_memory_stage_tries_the_top_first_and_closes_when_it_is_best() -> None:
    base = _full(0, "baseline", 0.9, 64, 100.0)
    mml = _full(1, "max_model_len", 0.9, 64, 100.0)
    # memory is the bottleneck: the stage's first trial is the top of the range
    assert _ask("gpu_memory_utilization", [base, mml], ST).gpu_memory_utilization == 0.95
    budget = {s.name: s.budget for s in stage_plan([base, mml], ST, B)}
    assert budget["gpu_memory_utilization"] == 4
    top = _full(2, "gpu_memory_utilization", 0.95, 64, 110.0)
    plan = {s.name: s for s in stage_plan([base, mml, top], ST, B)}
    assert plan["gpu_memory_utilization"].budget == 1
    assert "top of the range is best" in plan["gpu_memory_utilization"].why
    # the trials saved went to the concurrency passes: the study's size is unchanged
    assert sum(s.budget for s in plan.values()) == 30 - 1
    # a later stage's better trial does not reopen the closed stage
    later = _full(3, "max_num_seqs", 0.95, 32, 150.0)
    again = {s.name: s.budget for s in stage_plan([base, mml, top, later], ST, B)}
    assert again["gpu_memory_utilization"] == 1
    # a top that scores below the best so far (noise, a tight GPU) keeps the line search going
    worse = _full(2, "gpu_memory_utilization", 0.95, 64, 90.0)
    kept = {s.name: s.budget for s in stage_plan([base, mml, worse], ST, B)}
    assert kept["gpu_memory_utilization"] == 4
    assert _ask("gpu_memory_utilization", [base, mml, worse], ST).gpu_memory_utilization < 0.95


def test_staged_joint_refinement_holds_the_memory_parameters() -> None:
    trials = [
        _full(0, "baseline", 0.9, 64, 100.0),
        _full(1, "gpu_memory_utilization", 0.95, 64, 120.0),
        _full(2, "max_num_seqs", 0.95, 32, 130.0),
    ]
    staged = [_ask("joint", trials, ST, seed) for seed in range(6)]
    assert {(v.max_model_len, v.gpu_memory_utilization) for v in staged} == {(4096, 0.95)}
    # the concurrency pair moves from the best point (32 sequences, 2048 tokens) by the first
    # compass move, an octave more sequences at an octave fewer tokens, whatever the seed
    assert {(v.max_num_seqs, v.max_num_batched_tokens) for v in staged} == {(64, 1024)}
    # the joint strategy's TPE is free on every parameter: over a few draws util moves
    joint = StrategyConfig(name="joint", n_trials=30)
    assert {_ask("joint", trials, joint, seed).gpu_memory_utilization for seed in range(6)} != {
        0.95
    }


def test_joint_refinement_moves_from_the_best_point_and_follows_a_win() -> None:
    trials = [
        _full(0, "baseline", 0.9, 64, 100.0),
        _full(1, "gpu_memory_utilization", 0.95, 64, 120.0),
        _full(2, "max_num_seqs", 0.95, 32, 130.0),
    ]

    def joint(n: int, mns: int, mnbt: int, value: float) -> Any:
        t = _full(n, "joint", 0.95, mns, value)
        t.params["max_num_batched_tokens"] = mnbt
        return t

    # the first move (64, 1024) lost: the next is its opposite trade, fewer sequences at a
    # larger budget
    trials.append(joint(3, 64, 1024, 110.0))
    nxt = _ask("joint", trials, ST)
    assert (nxt.max_num_seqs, nxt.max_num_batched_tokens) == (16, 4096)
    # that one won: the moves start again from it, and the way back is not tried again
    trials.append(joint(4, 16, 4096, 140.0))
    nxt = _ask("joint", trials, ST)
    assert (nxt.max_num_seqs, nxt.max_num_batched_tokens) == (8, 8192)


def test_joint_refinement_splits_a_tied_diagonal_into_its_axis_moves() -> None:
    def at(n: int, stage: str, mns: int, mnbt: int, value: float, cap: float) -> Any:
        t = _full(n, stage, 0.95, mns, value)
        t.params["max_num_batched_tokens"] = mnbt
        t.user_attrs["capacity_scale"] = cap
        return t

    trials = [
        at(0, "baseline", 64, 2048, 100.0, 0.7),
        at(1, "max_num_seqs", 32, 2048, 130.0, 0.85),
    ]
    # the first move, (64, 1024), held exactly the best point's capacity at a lower figure:
    # more sequences gained what the smaller budget lost, so each knob alone comes next, the
    # sequences first; (64, 2048) was measured already (the baseline), so the budget alone
    trials.append(at(2, "joint", 64, 1024, 129.0, 0.85))
    nxt = _ask("joint", trials, ST)
    assert (nxt.max_num_seqs, nxt.max_num_batched_tokens) == (32, 1024)
    trials[0] = at(0, "baseline", 128, 2048, 100.0, 0.7)
    nxt = _ask("joint", trials, ST)
    assert (nxt.max_num_seqs, nxt.max_num_batched_tokens) == (64, 2048)
    # a move that held less than the best point's capacity splits into nothing: the usual
    # order, the opposite trade
    trials[2] = at(2, "joint", 64, 1024, 110.0, 0.8)
    nxt = _ask("joint", trials, ST)
    assert (nxt.max_num_seqs, nxt.max_num_batched_tokens) == (16, 4096)


def test_max_model_len_is_rechecked_at_the_tuned_concurrency() -> None:
    def at(number: int, stage: str, mml: int, mns: int, value: float) -> Any:
        t = _full(number, stage, 0.95, mns, value)
        t.params["max_model_len"] = mml
        return t

    # pass 1 kept 4096 (2048 scored lower at the baseline's concurrency); the passes tuned
    # max_num_seqs to 32 at 4096
    trials = [
        at(0, "baseline", 4096, 64, 100.0),
        at(1, "max_model_len", 2048, 64, 99.0),
        at(2, "max_num_seqs", 4096, 32, 130.0),
    ]
    one = _ask("max_model_len.2", trials, ST)
    assert (one.max_model_len, one.max_num_seqs, one.gpu_memory_utilization) == (2048, 32, 0.95)
    # the only other candidate measured at this point already: the pass does not let TPE
    # draw, it measures a candidate other than the best's again
    trials.append(at(3, "max_model_len.2", 2048, 32, 120.0))
    again = _ask("max_model_len.2", trials, ST)
    assert (again.max_model_len, again.max_num_seqs) == (2048, 32)
    # a study with one candidate left has no second pass over it
    single = SpaceBounds(max_model_len_candidates=(4096,))
    assert "max_model_len.2" not in {s.name for s in stage_plan(trials[:1], ST, single)}


def test_the_slo_nearest_its_limit_binds() -> None:
    slo = Slo(p99_ttft_ms=3000.0, p99_tpot_ms=50.0)
    assert binding_slo(1500.0, 45.0, slo) == "p99_tpot"  # 0.9 of its limit against 0.5
    assert binding_slo(2900.0, 45.0, slo) == "p99_ttft"
    assert binding_slo(1500.0, 25.0, slo) == "p99_ttft"  # a tie: TTFT
    assert binding_slo(1500.0, None, slo) is None  # not measured
    assert binding_slo(1500.0, 45.0, Slo(p99_ttft_ms=3000.0)) is None  # one SLO: nothing to pick


def test_a_coordinate_pass_polishes_beside_the_best_point() -> None:
    # the best point so far has max_num_seqs 64; pass 2 tries values beside it, within a
    # factor POLISH (sqrt 2) either way, closest first: a polish of what the joint
    # refinement found, not a second map of half to twice the value
    trials = [_full(0, "baseline", 0.95, 128, 100.0), _full(1, "joint", 0.95, 64, 130.0)]
    seen = []
    for n in range(2, 5):
        v = _ask("max_num_seqs.2", trials, ST).max_num_seqs
        assert 64 / POLISH - 1 <= v <= 64 * POLISH + 1 and v != 64 and v not in seen
        seen.append(v)
        trials.append(_full(n, "max_num_seqs.2", 0.95, v, 120.0))
    # the first two map the range's middle quarters: 64 x 2^(+-1/4) (54 and 76)
    assert sorted(seen[:2]) == [54, 76]


# -- a KV cache fixed in bytes: the memory stage cannot change anything ------------------------


def test_a_kv_size_fixed_in_bytes_gives_the_memory_stage_no_trial() -> None:
    fixed = replace(B, kv_cache_memory_bytes="2147483648")
    base = _full(0, "baseline", 0.9, 64, 100.0)  # its telemetry: memory under pressure
    assert {s.name: s.budget for s in stage_plan([base], ST, B)}["gpu_memory_utilization"] == 4
    plan = {s.name: s for s in stage_plan([base], ST, fixed)}
    mem = plan["gpu_memory_utilization"]
    assert mem.budget == 0
    assert mem.why.startswith("skipped: worker.static_args.kv_cache_memory_bytes 2147483648")
    # the stage's trials went to the concurrency passes: the study's size is unchanged
    assert sum(s.budget for s in plan.values()) == 30 - 1
    # known before the baseline has run: never provisional
    running = _trial(0, {"label": "baseline"})
    running.state, running.value = TrialState.RUNNING, None
    early = {s.name: s.budget for s in stage_plan([running], ST, fixed)}
    assert early["gpu_memory_utilization"] == 0


def test_a_sim_study_with_a_fixed_kv_size_runs_no_memory_trial(tmp_path: Path) -> None:
    # 1 GiB of KV for Llama-3.1-8B (8k tokens); the same study without the fixed size plans
    # the memory stage's trials until its baseline says otherwise
    # baseline, max_model_len 1, then memory 2 or max_num_seqs 2: 4 trials tell them apart
    strategy = {
        "n_trials": 4,
        "trials_per_stage": 2,
        "joint_refinement": 1,
        "capacity_levels": 3,
        "validate": {"enabled": False},
    }
    kv = {"kind": "sim-virtual", "static_args": {"kv_cache_memory_bytes": 2**30}}
    workload = {**BASE["workload"], "num_prompts": 60}
    free, free_text = config(strategy=strategy, workload=workload)
    cfg, text = config(strategy=strategy, worker=kv, workload=workload)
    with Store.open(f"sqlite:///{tmp_path / 'free.db'}") as store:
        create_study(free, free_text, store)
        assert any("gpu_memory_utilization 2 (provisional)" in ln for ln in study_plan(store, "t"))
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        [line] = [ln for ln in study_plan(store, "t") if ln.startswith("stages")]
        assert "gpu_memory_utilization 0 (skipped: worker.static_args.kv_cache_memory_bytes" in line
        run_study("t", store)
        trials = store.trials("t")
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
    assert len(trials) == 4
    assert "gpu_memory_utilization" not in {t.stage for t in trials}
    # every trial ran at the baseline's fraction: the stages never moved it
    assert {t.engine_args["gpu_memory_utilization"] for t in trials} == {0.9}
    # the simulator honoured the fixed size: every launch, whatever its max_num_seqs and
    # token budget, had 1 GiB of KV, 8192 tokens at Llama-3.1-8B's 128 KiB per token
    assert {t.kv_cache_tokens for t in trials} == {8192}
    assert len({t.engine_args["max_num_seqs"] for t in trials}) > 1
    assert study.user_attrs["autotune.bounds"].count('"kv_cache_memory_bytes": "1073741824"') == 1


# -- the token budget's floor --------------------------------------------------------------------


def _at_budget(number: int, stage: str, mnbt: int, value: float, pruned: bool = False) -> Any:
    t = _full(number, stage, 0.95, 64, value)
    t.params["max_num_batched_tokens"] = mnbt
    if pruned:  # settled (docs/tuning.md#14-settling-losing-trials)
        t.state, t.values = TrialState.PRUNED, None
    return t


def test_the_token_budget_tries_its_floor_when_its_map_found_no_rise() -> None:
    """Pass 1's token budget line maps its grid; when no point there beats where the line
    began (the best trial of the stages before), its floor comes next, before narrowing in
    (docs/tuning.md#8-the-staged-plan); when one does, the line narrows in as before."""
    trials = [
        _full(0, "baseline", 0.9, 64, 100.0),
        _full(1, "max_model_len", 0.9, 64, 100.0),
        _full(2, "gpu_memory_utilization", 0.95, 64, 110.0),
    ]
    stage = "max_num_batched_tokens"
    grid = []
    for n in (3, 4):
        v = _ask(stage, trials, ST).max_num_batched_tokens
        assert v != 256
        grid.append(v)
        trials.append(_at_budget(n, stage, v, 0.0, pruned=True))
    # both grid points settled below the line's start (2048 at 110 tok/s): the floor next
    assert _ask(stage, trials, ST).max_num_batched_tokens == 256
    # a grid point that rose: no floor, the line narrows in beside it
    risen = [*trials[:3], _at_budget(3, stage, grid[0], 130.0), trials[4]]
    assert _ask(stage, risen, ST).max_num_batched_tokens != 256
    # a coordinate pass (k >= 2) polishes within POLISH of the best point
    assert _ask("max_num_batched_tokens.2", trials, ST).max_num_batched_tokens > 256
