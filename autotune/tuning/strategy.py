"""Strategies: which stage the next trial belongs to and which sampler suggests it.

``staged`` (default; the seed guide's method): the baseline (and any ``enqueue:`` configs)
first, then one stage per parameter in the fixed order, each tuning only that parameter with
every other one fixed at the best feasible point found so far (Optuna's
``PartialFixedSampler``), then an optional short joint refinement.
``joint``: one constrained multivariate TPE over all parameters, still suggested in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import StrategyConfig
from autotune.tuning.space import MNBT_PARAM, SpaceBounds

__all__ = ["best_trial", "fixed_point", "next_stage", "planned_total", "sampler_for",
           "stage_params"]


def stage_params(b: SpaceBounds) -> list[str]:
    """Sampler parameter names, one stage each, in the fixed order (extras last)."""
    return ["max_model_len", "gpu_memory_utilization", "max_num_seqs", MNBT_PARAM,
            *(name for name, _ in b.extras)]


def _stage_name(param: str) -> str:
    return "max_num_batched_tokens" if param == MNBT_PARAM else param


def _done(trials: Sequence[FrozenTrial], stage: str) -> int:
    return sum(1 for t in trials if t.user_attrs.get("stage") == stage
               and t.state == TrialState.COMPLETE)


def next_stage(trials: Sequence[FrozenTrial], st: StrategyConfig, b: SpaceBounds,
               waiting: int) -> str | None:
    """The stage of the next trial, or None when the plan is complete. ``n_trials`` is the
    study's whole budget (baseline and enqueued trials included)."""
    if waiting:
        return "enqueued"
    if sum(1 for t in trials if t.state == TrialState.COMPLETE) >= st.n_trials:
        return None
    if st.name == "joint":
        return "joint"
    for p in stage_params(b):
        choices = _choices(b, p)
        budget = min(st.trials_per_stage, len(choices)) if choices else st.trials_per_stage
        if _done(trials, _stage_name(p)) < budget:
            return _stage_name(p)
    return "joint" if _done(trials, "joint") < st.joint_refinement else None


def planned_total(st: StrategyConfig, b: SpaceBounds, enqueued: int) -> int:
    """How many trials the plan holds in all (for "trial k of N" displays)."""
    if st.name == "joint":
        return max(st.n_trials, enqueued)
    stages = 0
    for p in stage_params(b):
        choices = _choices(b, p)
        stages += min(st.trials_per_stage, len(choices)) if choices else st.trials_per_stage
    return min(st.n_trials, enqueued + stages + st.joint_refinement)


def best_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """Highest objective among feasible trials; with none feasible, the least violating."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    feasible = [t for t in done if all(v <= 0 for v in t.constraints.values())]
    if feasible:
        return max(feasible, key=lambda t: (t.value or 0.0, -t.number))
    if not done:
        return None
    return min(done, key=lambda t: (sum(max(v, 0.0) for v in t.constraints.values()),
                                    t.number))


def _choices(b: SpaceBounds, param: str) -> tuple[Any, ...] | None:
    """A categorical parameter's choices (its stage enumerates them instead of sampling)."""
    if param == "max_model_len":
        return b.max_model_len_candidates
    return dict(b.extras).get(param)


def _clip(b: SpaceBounds, name: str, value: Any) -> Any:
    if name == "max_model_len":
        return min(b.max_model_len_candidates, key=lambda c: (abs(c - int(value)), c))
    if name == "gpu_memory_utilization":
        return round(min(max(float(value), b.util_low), b.util_high), 2)
    if name == "max_num_seqs":
        return min(max(int(value), b.mns_low), b.mns_high)
    if name == MNBT_PARAM:
        return min(max(float(value), 0.0), 1.0)
    return value


def fixed_point(trials: Sequence[FrozenTrial], b: SpaceBounds, free: str) -> dict[str, Any]:
    """Every parameter except ``free``, at the best point so far, clipped into the ranges
    (the baseline may lie outside them: the stages start from the best in-range point)."""
    best = best_trial(trials)
    if best is None:
        return {}
    return {k: _clip(b, k, v) for k, v in best.params.items()
            if k in stage_params(b) and k != free}


def sampler_for(stage: str, trials: Sequence[FrozenTrial], b: SpaceBounds,
                seed: int) -> optuna.samplers.BaseSampler:
    tpe = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                     n_startup_trials=min(10, max(2, len(trials) // 2)))
    if stage in ("joint", "enqueued"):
        return tpe
    free = MNBT_PARAM if stage == "max_num_batched_tokens" else stage
    fixed = fixed_point(trials, b, free)
    choices = _choices(b, free)
    if choices is not None:
        # A categorical stage tries each choice once, in order,
        # instead of letting TPE draw the same few values again.
        tried = {t.params.get(free) for t in trials if t.user_attrs.get("stage") == stage}
        untried = [c for c in choices if c not in tried]
        if untried:
            fixed[free] = untried[0]
            return optuna.samplers.PartialFixedSampler(fixed, tpe)
    return optuna.samplers.PartialFixedSampler(fixed, tpe) if fixed else tpe
