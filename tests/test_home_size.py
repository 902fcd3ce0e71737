"""The home size of a study that searches the parallelism
(docs/tuning.md#16-the-parallelism-stage): which size the stages after the re-check tune,
when the joint refinement gives way to the coordinate passes, which sizes the re-check
skips. Pure: tiny in-memory trials."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import StrategyConfig
from autotune.tuning.run.claims import Wait, decide, stage_order
from autotune.tuning.search.home_size import RECHECK, home_trial, moved, unfit_sizes
from autotune.tuning.search.ranking import TIE
from autotune.tuning.search.space import SpaceBounds
from autotune.tuning.search.stages import stage_plan
from autotune.tuning.search.strategy import sampler_for

_DISTS = {
    "tensor_parallel_size": CategoricalDistribution([1, 2, 4]),
    "max_model_len": CategoricalDistribution([4096]),
    "gpu_memory_utilization": FloatDistribution(0.8, 0.95, step=0.01),
    "max_num_seqs": IntDistribution(1, 1024, log=True),
    "max_num_batched_tokens": IntDistribution(1, 65536, log=True),
}
B = SpaceBounds(max_model_len_candidates=(4096,), parallel=(1, 2))
ST = StrategyConfig(trials_per_stage=2, joint_refinement=3, n_trials=20)


def trial(
    number: int,
    stage: str,
    tp: int,
    value: float | None,
    *,
    util: float = 0.9,
    seqs: int = 128,
    tokens: int = 2048,
    failure: str | None = None,
    state: TrialState = TrialState.COMPLETE,
) -> FrozenTrial:
    attrs: dict[str, Any] = {"stage": stage, "failure_class": failure}
    if stage == "baseline":
        attrs["label"] = "baseline"
    t = create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        params={
            "tensor_parallel_size": tp,
            "max_model_len": 4096,
            "gpu_memory_utilization": util,
            "max_num_seqs": seqs,
            "max_num_batched_tokens": tokens,
        },
        distributions=_DISTS,
        user_attrs=attrs,
        # an infeasible trial (a failed launch) violates every constraint
        system_attrs={"constraints": [1.0] if failure else [-1.0]},
    )
    t.number = number
    return t


def fixed_by(stage: str, trials: list[FrozenTrial], b: SpaceBounds) -> dict[str, Any]:
    """The values the stage's sampler holds for its next trial."""
    study = optuna.create_study(direction="maximize")
    for t in trials:
        study.add_trial(t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks PartialFixedSampler experimental
        sampler = sampler_for(stage, study.get_trials(deepcopy=False), b, seed=0, st=ST)
    return dict(sampler._fixed_params)  # type: ignore[attr-defined]


def pass_one(best_tp: int = 2) -> list[FrozenTrial]:
    """Baseline at TP 1, the parallelism stage's TP 2, then pass 1 tuning at ``best_tp``."""
    return [
        trial(0, "baseline", 1, 90.0, seqs=1024, tokens=8192),
        trial(1, "tensor_parallel_size", 2, 100.0, seqs=376, tokens=8192),
        trial(2, "max_num_seqs", best_tp, 104.0, seqs=198, tokens=8192),
        trial(3, "max_num_batched_tokens", best_tp, 105.0, seqs=198, tokens=1218),
    ]


def test_a_rechecked_size_within_a_tie_becomes_home() -> None:
    before = pass_one()
    assert home_trial(before) is before[3]  # no re-check yet: the best trial
    # TP 1 at the carried point (99 / 609), 0.5 % under the best: a tie, so TP 1 is home
    tie = trial(4, RECHECK, 1, 105.0 * (1 - TIE / 2), seqs=99, tokens=609)
    assert home_trial([*before, tie]) is tie
    assert moved([*before, tie])
    # a later, better TP 1 trial is home: the stages go on inside TP 1
    polish = trial(5, "max_num_batched_tokens.2", 1, 104.8, seqs=99, tokens=512)
    assert home_trial([*before, tie, polish]) is polish and moved([*before, tie, polish])
    # 2 % under: not a tie, the study stays where it was
    far = trial(4, RECHECK, 1, 105.0 * (1 - 2 * TIE), seqs=99, tokens=609)
    assert home_trial([*before, far]) is before[3] and not moved([*before, far])
    # a re-check still running moves nothing yet
    running = trial(4, RECHECK, 1, None, state=TrialState.RUNNING)
    assert not moved([*before, running])


def test_once_moved_the_joint_refinement_gives_its_trials_to_the_coordinate_passes() -> None:
    before = pass_one()
    plan = [s.name for s in stage_plan(before, ST, B)]
    # the re-check comes before the joint refinement, and the claims keep that order
    assert plan.index(RECHECK) < plan.index("joint")
    assert stage_order(RECHECK, B) < stage_order("joint", B) < stage_order("max_num_seqs.2", B)
    stayed = {s.name: s.budget for s in stage_plan([*before, trial(4, RECHECK, 1, 80.0)], ST, B)}
    assert stayed["joint"] == 3
    tie = trial(4, RECHECK, 1, 105.0, seqs=99, tokens=609)
    went = {s.name: s.budget for s in stage_plan([*before, tie], ST, B)}
    assert "joint" not in went
    passes = sum(n for name, n in went.items() if name.endswith((".2", ".3", ".4")))
    kept = sum(n for name, n in stayed.items() if name.endswith((".2", ".3", ".4")))
    # the same total plan: the joint's three trials moved to the coordinate passes
    assert sum(went.values()) == sum(stayed.values())
    assert passes - went[RECHECK] == kept - stayed[RECHECK] + 3


def test_the_passes_after_a_move_start_from_the_home_sizes_point() -> None:
    tie = trial(4, RECHECK, 1, 105.0, seqs=99, tokens=609)
    trials = [*pass_one(), tie]
    plan = [s.name for s in stage_plan(trials, ST, B)]
    assert {"max_num_seqs.2", "max_num_batched_tokens.2"} <= set(plan)
    # each pass holds TP 1 and the other knob at the carried point, not TP 2's best
    seqs = fixed_by("max_num_batched_tokens.2", trials, B)
    assert seqs["tensor_parallel_size"] == 1 and seqs["max_num_seqs"] == 99
    tokens = fixed_by("max_num_seqs.2", trials, B)
    assert tokens["tensor_parallel_size"] == 1 and tokens["max_num_batched_tokens"] == 609
    # without the move they hold TP 2's best
    far = trial(4, RECHECK, 1, 80.0, seqs=99, tokens=609)
    assert fixed_by("max_num_seqs.2", [*pass_one(), far], B)["max_num_batched_tokens"] == 1218


def test_a_size_that_found_no_memory_at_the_tuned_utilization_is_not_rechecked() -> None:
    b = SpaceBounds(max_model_len_candidates=(4096,), parallel=(1, 2, 4))
    base = trial(0, "baseline", 1, 0.0, failure="NO_KV_MEMORY")
    two = trial(1, "tensor_parallel_size", 2, 50.0)
    four = trial(2, "tensor_parallel_size", 4, 100.0)
    trials = [base, two, four]
    assert unfit_sizes(trials) == {1}
    recheck = next(s for s in stage_plan(trials, ST, b) if s.name == RECHECK)
    assert recheck.budget == 1 and "skipped TP 1" in recheck.why  # TP 2 only, and why
    # the re-check measures TP 2, never TP 1
    assert fixed_by(RECHECK, trials, b)["tensor_parallel_size"] == 2
    # a launch that failed at a lower utilization than the best point's may fit there
    low = trial(0, "baseline", 1, 0.0, util=0.85, failure="NO_KV_MEMORY")
    assert unfit_sizes([low, two, four]) == set()
    # one launch of the size that ran is enough to re-check it
    ran = trial(3, "max_num_seqs", 1, 10.0)
    assert unfit_sizes([*trials, ran]) == set()
    # a failure that is not about memory says nothing about the size
    assert unfit_sizes([trial(0, "baseline", 1, 0.0, failure="ENGINE_DEAD"), two, four]) == set()


def test_no_later_stage_is_claimed_while_the_recheck_runs() -> None:
    """The re-check decides whether the joint refinement runs and where the later stages
    start: another controller (or lane) waits for it rather than claim past it."""
    st = StrategyConfig(trials_per_stage=1, joint_refinement=3, n_trials=20)
    done = pass_one()
    # the baseline showed memory is not the bottleneck: pass 1 is complete
    done[0].user_attrs.update(kv_usage_peak=0.3, preemptions=0.0, levels=3)
    assert decide(done, st, B) == RECHECK
    running = trial(4, RECHECK, 1, None, state=TrialState.RUNNING)
    got = decide([*done, running], st, B)
    assert isinstance(got, Wait) and RECHECK in got.reason and got.running == 1
    # once it is done, the next stage is claimed: the joint refinement, or after a move the
    # coordinate passes
    assert decide([*done, trial(4, RECHECK, 1, 80.0)], st, B) == "joint"
    after_move = decide([*done, trial(4, RECHECK, 1, 105.0)], st, B)
    assert isinstance(after_move, str) and after_move.endswith(".2") and after_move != RECHECK
