"""Strategies: which stage the next trial belongs to and which sampler suggests it.

``staged`` (default; the seed guide's method,
docs/method.md#4-one-variable-at-a-time-in-a-fixed-order): the baseline (and any ``enqueue:``
configs) first, then one stage per parameter in the fixed order, each tuning only that
parameter with every other one fixed at the ENGINE values of the best feasible point found so
far (Optuna's ``PartialFixedSampler``), with budgets the baseline's diagnosis decides
(:mod:`autotune.tuning.search.stages`), then an optional short joint refinement.
``joint``: one constrained multivariate TPE over all parameters, still suggested in order.
``random``: independent uniform draws over the same space (a reference point for the others).
``grid``: in the style of vLLM's ``benchmarks/auto_tune/auto_tune.sh``: ``max_model_len`` and
``gpu_memory_utilization`` fixed at the top of their ranges, a log-spaced grid of
``max_num_seqs`` x ``max_num_batched_tokens`` sized to the trial budget, visited in a seeded
random order (as Optuna's GridSampler does) so that a study cut short still spans the grid.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import StrategyConfig
from autotune.tuning.attrs import capacity_of, engine_value, stage_of
from autotune.tuning.search.home_size import RECHECK, home_trial, size_of, unfit_sizes
from autotune.tuning.search.linesearch import next_on_line
from autotune.tuning.search.pattern import next_on_plane
from autotune.tuning.search.space import (
    MNBT_PARAM,
    TP_PARAM,
    SpaceBounds,
    mnbt_engine_value,
    mnbt_range,
)
from autotune.tuning.search.stages import (
    CONCURRENCY,
    at_top,
    baseline_trial,
    choices_of,
    stage_param,
    stage_params,
    stage_plan,
)

__all__ = [
    "MEASURED",
    "SETTLED_SCORE",
    "compass_move",
    "fixed_point",
    "grid_points",
    "next_stage",
    "planned_total",
    "sampler_for",
    "stage_params",
]


# A coordinate pass (k >= 2) searches the best point's value divided or multiplied by up to
# this: it polishes what the joint refinement found, so its first two trials lie at
# 2^(+-1/4) of the best value. With 2 (half to twice) they lay at 2^(+-1/2) and stepped over
# the long-context scenario's sharp peak in the token budget (docs/tuning.md#8-the-staged-plan)
POLISH = 2.0**0.5


def _stage_name(param: str) -> str:
    return param  # every sampler parameter is named after its engine arg


# a settled trial (docs/tuning.md#14-settling-losing-trials) is Optuna's PRUNED: measured,
# its capacity only bounded below the best so far
MEASURED = (TrialState.COMPLETE, TrialState.PRUNED)
# a settled trial's score on a line: below every feasible trial (it cannot beat the best),
# above an infeasible one (it may hold its SLOs at a lower load)
SETTLED_SCORE = -0.5


def _done(trials: Sequence[FrozenTrial], stage: str, running: bool = False) -> int:
    states = (*MEASURED, TrialState.RUNNING) if running else MEASURED
    return sum(1 for t in trials if stage_of(t) == stage and t.state in states)


def _geom(lo: float, hi: float, n: int) -> list[float]:
    if n <= 1 or hi <= lo:
        return [hi]
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def grid_points(b: SpaceBounds, st: StrategyConfig) -> list[dict[str, Any]]:
    """The grid strategy's sampler parameters, in visiting order (seeded by the grid's size
    only, so every controller of a study walks the same order). Sized for the trial budget
    less the baseline."""
    n = max(1, st.n_trials - 1)
    n_mns = max(1, round(math.sqrt(n / 1.5)))
    n_mnbt = max(1, n // n_mns)
    mml = max(b.max_model_len_candidates)
    chunked = b.enable_chunked_prefill
    pts: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for mns in sorted({round(x) for x in _geom(b.mns_low, b.mns_high, n_mns)}):
        lo, hi = mnbt_range(b, mml, mns, chunked)
        for tok in _geom(b.mnbt_low, b.mnbt_high, n_mnbt):
            value = mnbt_engine_value(round(tok), lo, hi)
            if (mns, value) in seen:
                continue
            seen.add((mns, value))
            pts.append(
                {
                    "max_model_len": mml,
                    "gpu_memory_utilization": round(b.util_high, 2),
                    "max_num_seqs": mns,
                    MNBT_PARAM: value,
                    **{name: choices[0] for name, choices in b.extras},
                    **({TP_PARAM: b.parallel[0]} if b.parallel else {}),
                }
            )
    random.Random(len(pts)).shuffle(pts)
    return pts


def next_stage(
    trials: Sequence[FrozenTrial], st: StrategyConfig, b: SpaceBounds, waiting: int
) -> str | None:
    """The stage of the next trial, or None when the plan is complete. ``n_trials`` is the
    study's whole budget (baseline and enqueued trials included)."""
    if waiting:
        return "enqueued"
    if sum(1 for t in trials if t.state in MEASURED) >= st.n_trials:
        return None
    if st.name in ("joint", "random"):
        return st.name
    if st.name == "twin":  # the round that names each config: tuning/measure/twin_round.py
        return "twin" if _done(trials, "twin") < st.twin.real_trials else None
    if st.name == "grid":
        return "grid" if _done(trials, "grid", running=True) < len(grid_points(b, st)) else None
    for stage in stage_plan(trials, st, b):
        if _done(trials, stage.name) < stage.budget:
            return stage.name
    return None


def planned_total(
    st: StrategyConfig,
    b: SpaceBounds,
    enqueued: int,
    trials: Sequence[FrozenTrial] = (),
) -> int:
    """How many trials the plan holds in all (for "trial k of N" displays)."""
    if st.name in ("joint", "random"):
        return max(st.n_trials, enqueued)
    if st.name == "twin":
        return min(st.n_trials, enqueued + st.twin.real_trials)
    if st.name == "grid":
        return min(st.n_trials, enqueued + len(grid_points(b, st)))
    stages = sum(s.budget for s in stage_plan(trials, st, b))
    return min(st.n_trials, enqueued + stages)


def _clip(b: SpaceBounds, name: str, value: Any) -> Any:
    if name == "max_model_len":
        return min(b.max_model_len_candidates, key=lambda c: (abs(c - int(value)), c))
    if name == "gpu_memory_utilization":
        return round(min(max(float(value), b.util_low), b.util_high), 2)
    if name == "max_num_seqs":
        return min(max(int(value), b.mns_low), b.mns_high)
    if name == MNBT_PARAM:
        return min(max(int(value), b.mnbt_low), b.mnbt_high)
    return value


def fixed_point(trials: Sequence[FrozenTrial], b: SpaceBounds, free: str) -> dict[str, Any]:
    """Every parameter except ``free``, at the best point's ENGINE values (the home size's
    best, :func:`~autotune.tuning.search.home_size.home_trial`; a suggestion of
    ``max_num_batched_tokens`` below its valid minimum ran at the minimum: that is the value
    to hold), clipped into the ranges (the baseline may lie outside them: the stages start
    from the best in-range point)."""
    best = home_trial(trials)
    if best is None:
        return {}
    names = stage_params(b)
    return {k: _clip(b, k, engine_value(best, k)) for k in best.params if k in names and k != free}


def sampler_for(
    stage: str,
    trials: Sequence[FrozenTrial],
    b: SpaceBounds,
    seed: int,
    st: StrategyConfig | None = None,
) -> optuna.samplers.BaseSampler:
    if stage == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if stage == "grid":
        assert st is not None, "the grid needs the strategy config"
        n_tried = _done(trials, "grid", running=True)
        pts = grid_points(b, st)
        return optuna.samplers.PartialFixedSampler(
            pts[min(n_tried, len(pts) - 1)], optuna.samplers.RandomSampler(seed=seed)
        )
    tpe = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, n_startup_trials=min(10, max(2, len(trials) // 2))
    )
    if stage == "enqueued" or (stage == "joint" and (st is None or st.name != "staged")):
        return tpe  # the joint strategy: one multivariate TPE over every parameter
    if stage == "joint":
        # the joint refinement follows the ridge of the two concurrency knobs by compass moves
        # from the best point (autotune.tuning.search.pattern); TPE draws only once every
        # move is tried, with the memory parameters where their stages left them
        move = compass_move(trials, b)
        if move is not None:
            return optuna.samplers.PartialFixedSampler(move, tpe)
        held = _held(trials, b)
        return optuna.samplers.PartialFixedSampler(held, tpe) if held else tpe
    free, k = stage_param(stage)
    fixed = fixed_point(trials, b, free)
    choices = choices_of(b, free)
    if choices is not None and stage == RECHECK:
        # sizes that found no memory at the tuned utilization are not re-checked
        unfit = unfit_sizes(trials)
        choices = tuple(c for c in choices if c not in unfit)
    if choices is not None:
        # A categorical stage tries each choice once, in order,
        # instead of letting TPE draw the same few values again.
        tried = {t.params.get(free) for t in trials if stage_of(t) == stage}
        base = baseline_trial(trials)
        if free in ("max_model_len", TP_PARAM) and base is not None and k == 1:
            tried.add(base.params.get(free))  # measured already: the stage tries the others
        if k >= 2:
            # a later pass re-checks the choices at the best point: one measured there
            # already (the best's own value, or a choice this pass tried) is not run again
            tried |= {c for c in choices if _measured_at(trials, b, {**fixed, free: c})}
        untried = [c for c in choices if c not in tried]
        best = home_trial(trials)
        if not untried and k >= 2 and best is not None:
            # every choice measured at this point already (a parallel controller's, or a
            # restarted pass): measure another than the best's rather than let TPE pick
            now = _clip(b, free, engine_value(best, free))
            untried = [c for c in choices if c != now]
        if untried:
            if free == TP_PARAM and k >= 2 and best is not None:
                now = size_of(best)
                fixed = _per_device_point(b, fixed, now, int(untried[0]))
            fixed[free] = untried[0]
            return optuna.samplers.PartialFixedSampler(fixed, tpe)
    elif fixed and st is not None:
        value = _line_value(trials, b, st, stage, free, fixed, k)
        if value is not None:
            fixed[free] = value
    return optuna.samplers.PartialFixedSampler(fixed, tpe) if fixed else tpe


def _held(trials: Sequence[FrozenTrial], b: SpaceBounds) -> dict[str, Any]:
    """The joint refinement's fixed parameters: every one but the two concurrency knobs, at
    the best point (more memory only helps, and the max_model_len stage chose on over-length
    and capacity, so no trial is spent undoing them)."""
    return {k: v for k, v in fixed_point(trials, b, "max_num_seqs").items() if k not in CONCURRENCY}


def compass_move(trials: Sequence[FrozenTrial], b: SpaceBounds) -> dict[str, Any] | None:
    """The staged joint refinement's next trial as a compass move from the best point (every
    parameter, the held ones included), or None once every move is tried (TPE draws then)."""
    held = _held(trials, b)
    point = _plane_point(trials, b, held) if held else None
    return None if point is None else {**held, **point}


def _plane_point(
    trials: Sequence[FrozenTrial], b: SpaceBounds, held: dict[str, Any]
) -> dict[str, Any] | None:
    """The joint refinement's next concurrency (:mod:`autotune.tuning.search.pattern`): a
    compass move from the best point over the trials at the held memory parameters."""
    best = home_trial(trials)
    if best is None:
        return None
    mml = int(held["max_model_len"])

    def clip(seqs: float, tokens: float) -> tuple[int, int]:
        m = _clip(b, "max_num_seqs", round(seqs))
        lo, hi = mnbt_range(b, mml, m, b.enable_chunked_prefill)
        return m, mnbt_engine_value(round(tokens), lo, hi)

    home = clip(engine_value(best, "max_num_seqs"), engine_value(best, MNBT_PARAM))
    plane = [
        (t, clip(engine_value(t, "max_num_seqs"), engine_value(t, MNBT_PARAM)))
        for t in sorted(trials, key=lambda t: t.number)
        if t.state in (*MEASURED, TrialState.RUNNING)
        and all(n in t.params for n in CONCURRENCY)
        and _at(t, b, held)
    ]
    tried = {p for _, p in plane}
    # the points that held exactly the home's capacity: a tied diagonal is split into its
    # two axis moves first (docs/tuning.md#8-the-staged-plan, "The joint refinement")
    edge = capacity_of(best)
    ties = [
        p
        for t, p in plane
        if edge is not None
        and t.state == TrialState.COMPLETE
        and t.number != best.number
        and capacity_of(t) == edge
    ]
    point = next_on_plane(home, tried, clip, ties)
    return None if point is None else {"max_num_seqs": point[0], MNBT_PARAM: point[1]}


def _at(t: FrozenTrial, b: SpaceBounds, point: dict[str, Any]) -> bool:
    """The trial ran at ``point``'s values (engine values, clipped as stages hold them)."""
    return all(_clip(b, n, engine_value(t, n)) == v for n, v in point.items())


def _measured_at(trials: Sequence[FrozenTrial], b: SpaceBounds, point: dict[str, Any]) -> bool:
    """A measured (complete or settled) or running trial ran ``point``."""
    return any(
        t.state in (*MEASURED, TrialState.RUNNING)
        and all(n in t.params for n in point)
        and _at(t, b, point)
        for t in trials
    )


def _per_device_point(b: SpaceBounds, fixed: dict[str, Any], now: int, size: int) -> dict[str, Any]:
    """The tuned point of size ``now`` carried to another tensor-parallel ``size``: at the
    same load per device a server of k devices holds k times the sequences and schedules k
    times the tokens per step, so both concurrency knobs scale with the size
    (docs/tuning.md#16-the-parallelism-stage)."""
    out = dict(fixed)
    for name in CONCURRENCY:
        if name in out:
            out[name] = _clip(b, name, round(int(out[name]) * size / now))
    return out


def _line_value(
    trials: Sequence[FrozenTrial],
    b: SpaceBounds,
    st: StrategyConfig,
    stage: str,
    free: str,
    fixed: dict[str, Any],
    k: int = 1,
) -> float | None:
    """A numeric stage's next value by line search (:mod:`autotune.tuning.search.linesearch`) over
    the trials that lie on the stage's line: every other parameter at the fixed values. Pass
    ``k`` >= 2 (a coordinate pass, docs/tuning.md#8-the-staged-plan) searches the best
    point's value divided or multiplied by up to :data:`POLISH`."""
    if free == "gpu_memory_utilization":
        lo, hi, log, step = b.util_low, b.util_high, False, 0.01
    elif free == "max_num_seqs":
        lo, hi, log, step = b.mns_low, b.mns_high, True, 1.0
    elif free == MNBT_PARAM:
        mml, mns = int(fixed["max_model_len"]), int(fixed["max_num_seqs"])
        lo, hi = mnbt_range(b, mml, mns, b.enable_chunked_prefill)
        log, step = True, 1.0
    else:
        return None
    best = home_trial(trials)
    if k >= 2 and best is not None:
        x = float(_clip(b, free, engine_value(best, free)))
        lo, hi = max(lo, x / POLISH), min(hi, x * POLISH)
        if step >= 1:
            lo, hi = float(math.ceil(lo)), float(math.floor(hi))
    points: list[tuple[float, float | None]] = []
    prior: list[float] = []  # the scores on the line from before this stage
    top_tried = False
    for t in trials:
        if t.state not in (*MEASURED, TrialState.RUNNING) or free not in t.params:
            continue
        if not _at(t, b, fixed):
            continue
        v = float(engine_value(t, free))
        if not lo <= v <= hi:
            continue  # off this pass's range
        score: float | None = None
        if t.state == TrialState.COMPLETE and t.value is not None:
            feasible = all(v <= 0 for v in t.constraints.values())
            score = float(t.value) if feasible else -1.0
        elif t.state == TrialState.PRUNED:
            score = SETTLED_SCORE
        points.append((v, score))
        if score is not None and stage_of(t) != stage:
            prior.append(score)
        top_tried = top_tried or at_top(v, hi)
    if free == "gpu_memory_utilization" and k == 1 and not top_tried:
        # more memory only adds KV blocks (capacity never falls as it rises): the top of the
        # range first, and the stage closes when it is best (stages._top_best)
        return round(hi, 2)
    budget = next((s.budget for s in stage_plan(trials, st, b) if s.name == stage), 0)
    # pass 1's token budget: its floor next when the map found no rise over where the line
    # began (docs/tuning.md#8-the-staged-plan, "The token budget's floor")
    end = (lo, max(prior)) if free == MNBT_PARAM and k == 1 and prior else None
    n = 2 if k >= 2 else max(2, budget // 2 + 1)
    value = next_on_line(points, lo, hi, log=log, step=step, n_coarse=n, end=end)
    if value is None:
        return None
    return round(value, 2) if step < 1 else int(value)
