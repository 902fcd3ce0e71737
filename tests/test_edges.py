"""Widening an edge of the search space that the best config sits on, once
(autotune/tuning/search/edges.py; docs/tuning.md#8-the-staged-plan). Pure logic on tiny inputs, then
the claim-time glue on an in-memory study: stored, applied on resume, never twice."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import create_trial

from autotune.config import SearchConfig, StrategyConfig
from autotune.tuning.search.edges import (
    apply_widenings,
    stored_widenings,
    widen_at_claim,
    widenings,
)
from autotune.tuning.search.space import SpaceBounds, suggest
from autotune.tuning.search.strategy import sampler_for
from autotune.tuning.study_attrs import WIDENED_KEY

B = SpaceBounds(max_model_len_candidates=(4096,), mns_low=8, mns_high=128)
INSIDE = {"max_model_len": 4096, "max_num_seqs": 48, "max_num_batched_tokens": 1024}


def test_no_widening_inside_the_range() -> None:
    assert widenings(B, INSIDE, trial=3) == []
    # 9 % above the floor is still on it; 20 % is not
    assert widenings(B, {**INSIDE, "max_num_batched_tokens": 307}, trial=3) == []


def test_the_edges_the_best_point_sits_on_move_out_one_octave() -> None:
    best = {"max_model_len": 4096, "max_num_seqs": 128, "max_num_batched_tokens": 270}
    ws = widenings(B, best, trial=5)
    assert [(w.param, w.side, w.old, w.new) for w in ws] == [
        ("max_num_seqs", "ceiling", 128, 256),
        ("max_num_batched_tokens", "floor", 256, 128),
    ]
    b = apply_widenings(B, ws)
    assert (b.mns_low, b.mns_high, b.mnbt_low, b.mnbt_high) == (8, 256, 128, 65536)
    assert ws[1].line() == (
        "max_num_batched_tokens floor widened from 256 to 128: the best trial, 5, ran at 270, "
        "on the edge"
    )
    # once per edge: the widened floor is a new edge, not widened again
    assert widenings(b, {**best, "max_num_batched_tokens": 128}, trial=9, done=ws) == []


def test_edges_the_user_set_or_that_do_not_bind_stay() -> None:
    best = {"max_model_len": 4096, "max_num_seqs": 128, "max_num_batched_tokens": 256}
    search = SearchConfig.model_validate({"max_num_seqs": {"high": 128}})
    assert [w.param for w in widenings(B, best, trial=5, search=search)] == [
        "max_num_batched_tokens"
    ]
    # 256 sequences need a token budget of 256 anyway: the floor of 256 is not what binds
    wide = SpaceBounds(max_model_len_candidates=(4096,), mns_high=512)
    crowded = {**best, "max_num_seqs": 256, "max_num_batched_tokens": 256}
    assert widenings(wide, crowded, trial=1) == []


_DISTS = {
    "max_model_len": CategoricalDistribution([4096]),
    "gpu_memory_utilization": FloatDistribution(0.8, 0.95, step=0.01),
    "max_num_seqs": IntDistribution(8, 128, log=True),
    "max_num_batched_tokens": IntDistribution(256, 65536, log=True),
}


def _t(number: int, stage: str, mns: int, mnbt: int, value: float) -> Any:
    params = {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": mns,
        "max_num_batched_tokens": mnbt,
    }
    attrs = {"stage": stage, **({"label": "baseline"} if stage == "baseline" else {})}
    t = create_trial(
        params=params, distributions=_DISTS, value=value, user_attrs=attrs, constraints={"c0": -1.0}
    )
    t.number = number
    return t


def test_a_coordinate_pass_widens_once_stores_it_and_steps_past_the_old_edge() -> None:
    study = optuna.create_study(direction="maximize")
    trials = [
        _t(0, "baseline", 64, 2048, 100.0),
        _t(1, "max_num_seqs", 48, 2048, 110.0),
        _t(2, "max_num_batched_tokens", 48, 256, 130.0),  # the best: on the token floor
        _t(3, "max_num_batched_tokens", 48, 512, 120.0),
    ]
    for t in trials:
        study.add_trial(t)
    frozen = study.get_trials()
    # pass 1 and the joint refinement keep the ranges set at create
    assert widen_at_claim(study, B, frozen, "joint", None) == (B, [])
    b, new = widen_at_claim(study, B, frozen, "max_num_batched_tokens.2", None)
    assert [(w.param, w.side, w.new, w.trial) for w in new] == [
        ("max_num_batched_tokens", "floor", 128, 2)
    ]
    assert b.mnbt_low == 128 and study.user_attrs[WIDENED_KEY][0]["new"] == 128
    # a resumed controller reads the same bounds back, and widens nothing again
    again, none = widen_at_claim(study, B, frozen, "max_num_seqs.3", None)
    assert again == b and none == [] and len(stored_widenings(study.user_attrs)) == 1
    # the pass now searches below the old floor, within sqrt 2 of the best's 256: its first
    # trial went up (305, worse), the next goes down past the floor
    study.add_trial(_t(4, "max_num_batched_tokens.2", 48, 305, 125.0))
    frozen = study.get_trials()
    st = StrategyConfig(trials_per_stage=2, joint_refinement=0, n_trials=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks PartialFixedSampler experimental
        study.sampler = sampler_for("max_num_batched_tokens.2", frozen, b, 7, st)
        nxt = suggest(study.ask(), b).max_num_batched_tokens
        study.sampler = sampler_for("max_num_batched_tokens.2", frozen, B, 7, st)
        before = suggest(study.ask(), B).max_num_batched_tokens
    assert 182 <= nxt < 256, nxt  # below the floor the study was created with
    assert before >= 256, before  # without the widening the pass stays above it
