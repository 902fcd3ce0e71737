"""What the validation phase re-measures (docs/tuning.md#7-validation): the baseline and the
best configs of the search that behaved differently (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.store import RepeatRecord, TrialRecord

__all__ = ["candidates_of", "measured_alike", "runs_can_rank", "start_of", "told_apart"]


def told_apart(
    best: TrialRecord, other: TrialRecord, band_pct: float | None, step_pct: float | None
) -> bool:
    """The study already told ``other`` from ``best`` (docs/tuning.md#7-validation, "Which
    configs"): ``best``'s figure (capacity, with ``step_pct`` the lattice's step; else the
    objective) exceeds ``other``'s by more than the server's noise band plus one step, on
    the sample and jitter both ran on. Unmeasured noise (``band_pct`` None) tells nothing
    apart."""
    if band_pct is None:
        return False
    if step_pct is not None and best.capacity_scale and other.capacity_scale:
        a, b = best.capacity_scale, other.capacity_scale
    elif best.objective and other.objective:
        a, b, step_pct = best.objective, other.objective, 0.0
    else:
        return False
    return 100.0 * (a / b - 1.0) > band_pct + (step_pct or 0.0) + 1e-9


def runs_can_rank(band_pct: float | None, step_pct: float) -> bool:
    """The validation runs could rank a runner-up the study did not tell apart above the
    best (docs/tuning.md#7-validation, "Which configs"). Such a runner-up can lead by at most
    the server's noise band plus one lattice step (``step_pct``) in slo-capacity mode, the
    band in the one-level modes; a run resolves two steps (its lattice's) in the one and one
    step (the interval's floor) in the others. So the runs rank it only where the band is at
    least one step: where the baseline's boundary runs flipped a verdict or moved its figures
    by a step or more. Unmeasured noise (``band_pct`` None) bounds nothing."""
    return band_pct is None or band_pct >= step_pct - 1e-9


def start_of(
    run: RepeatRecord, in_study: Mapping[int, float | None], runs: Sequence[RepeatRecord]
) -> float | None:
    """Where validation run ``run`` starts its capacity search (docs/tuning.md#7-validation,
    "Where a run starts"): its config's capacity in the study (``in_study``, by trial
    number), moved by how far this repeat's sample moved the other candidates already
    measured on it (the median ratio of their runs' capacities to their capacities in the
    study). All runs of a repeat replay one sample, and the candidates, the best configs of
    one search, meet it alike: a sample heavier than the study's lowers their capacities
    together (the baseline, a different engine, moves on its own and starts at its study
    capacity). The start only decides where the search begins, never where it ends."""
    own = in_study.get(run.trial_number)
    if own is None:
        return None
    moved = []
    for r in runs:
        before = in_study.get(r.trial_number)
        if (
            r.repeat_index == run.repeat_index
            and r.role == run.role
            and r.trial_number != run.trial_number
            and r.state == "COMPLETE"
            and r.slo_held
            and r.capacity_scale is not None
            and before
        ):
            moved.append(r.capacity_scale / before)
    if not moved:
        return own
    shift = statistics.median(moved)
    return own * shift if math.isfinite(shift) and shift > 0 else own


def measured_alike(a: TrialRecord, b: TrialRecord) -> bool:
    """The two trials' measurements agree: objective, capacity, and at every load both
    measured the verdict and, where feasible, the latencies and throughput (a trial settled
    upwards from the best so far measures fewer loads than one searched from the lattice's
    ends, docs/tuning.md#14-settling-losing-trials; the capacity point and the next one up
    are measured by both). (Infeasible levels' figures
    are left out: with early stop they come from partial replays, and two configs that differ
    only above their capacity must compare the same whether or not their levels stopped,
    docs/tuning.md#10-early-stop-inside-a-level.) Different engine args measured alike
    behave alike to the engine (``max_num_seqs`` above the workload's concurrency, a token
    budget no step reaches): on the simulator, whose noise is common to every trial
    (docs/tuning.md#2-common-random-numbers), they re-measure alike on every sample too, so
    validating both spends runs on one behaviour. Real hardware's noise never repeats a
    float, so there nothing is alike. Without loaded levels only the objective and capacity
    are compared."""

    def figures(t: TrialRecord) -> dict[float, list[tuple[Any, ...]]]:
        by_load: dict[float, list[tuple[Any, ...]]] = {}
        for lv in t.levels:
            by_load.setdefault(lv.scale, []).append(
                (lv.feasible,)
                + ((lv.p99_ttft_ms, lv.p99_tpot_ms, lv.output_throughput) if lv.feasible else ())
            )
        return by_load

    if a.objective is None or (a.objective, a.capacity_scale) != (b.objective, b.capacity_scale):
        return False
    fa, fb = figures(a), figures(b)
    both = fa.keys() & fb.keys()
    if (fa or fb) and (not both or (a.capacity_scale is not None and a.capacity_scale not in both)):
        return False  # nothing in common, or not the capacity point itself
    return all(fa[k] == fb[k] for k in both)


def candidates_of(
    trials: Sequence[TrialRecord],
    top_k: int,
    rank: Callable[[TrialRecord], tuple[float, float]] | None = None,
) -> tuple[TrialRecord | None, list[TrialRecord]]:
    """The baseline trial and the ``top_k`` best feasible other configs (by ``rank``, the
    mode's ranking rule; default the in-study objective): distinct engine args, none equal to
    the baseline's, and none measured alike with the baseline or a config already chosen
    (:func:`measured_alike`), so that the runs compare ``top_k`` behaviours."""
    rank_of = rank or (lambda t: (t.objective or 0.0, 0.0))
    done = [t for t in trials if t.state == "COMPLETE"]
    base = next((t for t in done if t.stage == "baseline"), None)
    seen: list[TrialRecord] = [base] if base is not None else []
    ranked = sorted(
        (t for t in done if t is not base and t.feasible and t.objective),
        key=lambda t: (tuple(-x for x in rank_of(t)), t.optuna_trial_number),
    )
    out: list[TrialRecord] = []
    for t in ranked:
        if any(t.engine_args == s.engine_args or measured_alike(t, s) for s in seen):
            continue
        seen.append(t)
        out.append(t)
        if len(out) == top_k:
            break
    return base, out
