"""What the validation phase re-measures (docs/tuning.md#7-validation): the baseline and the
best configs of the search that behaved differently (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autotune.store import TrialRecord

__all__ = ["candidates_of", "measured_alike"]


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
