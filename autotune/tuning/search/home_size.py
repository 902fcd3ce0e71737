"""Which tensor-parallel size the stages after the re-check tune (pure; no I/O).

A study that searches the parallelism re-checks every other size once at the tuned point,
its concurrency knobs carried over per device (``tensor_parallel_size.2``,
docs/tuning.md#16-the-parallelism-stage). That point was tuned for the size the study was
on: carried to another size it is a first guess, so the other size's own optimum is at least
as good as what the re-check measured, and usually better. A re-checked size that comes
within :data:`~autotune.tuning.search.ranking.TIE` of the best so far (a difference the
protocol cannot resolve) therefore becomes the **home size**: the stages after the re-check
start from its best trial. The recommendation is still the best trial of any size.

Once the re-check has moved the study, the joint refinement gives its trials to the
coordinate passes: its TPE models every trial so far, and those of the other size hold the
same knob values at another load per device, a surface that is not the home size's. The
coordinate passes move one knob at a time from the carried point, along lines that hold
only the home size's trials.

A size whose every launch failed for memory (vLLM found no room for the weights and KV
blocks) at a ``gpu_memory_utilization`` at least the home point's is not re-checked: the
re-check changes only the concurrency knobs, which move the activation profile by a few
hundred MB, not the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.failures import FailureClass
from autotune.tuning.attrs import engine_value, failure_class_of, stage_of
from autotune.tuning.search.ranking import TIE, best_trial, feasible_ranked
from autotune.tuning.search.space import TP_PARAM

__all__ = ["RECHECK", "home_trial", "moved", "size_of", "unfit_sizes"]

# the parallelism stage's second pass, after the fixed order's first
RECHECK = f"{TP_PARAM}.2"
# the classes of a launch that found no memory for its weights and KV blocks
_NO_ROOM = (FailureClass.NO_KV_MEMORY, FailureClass.FREE_MEMORY)


def size_of(t: FrozenTrial) -> int:
    """The tensor-parallel size a trial ran (1: vLLM's default)."""
    return int(engine_value(t, TP_PARAM) or 1)


def home_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The point the next stage starts from: the best trial, or, once a re-checked size has
    scored within :data:`TIE` of it, the best trial of that size."""
    best = best_trial(trials)
    ranked = feasible_ranked(trials)
    rechecks = [t for t in ranked if stage_of(t) == RECHECK]
    if best is None or best.value is None or not rechecks:
        return best
    top = rechecks[0]
    if float(top.value or 0.0) < float(best.value) * (1.0 - TIE):
        return best
    return best_trial([t for t in trials if size_of(t) == size_of(top)])


def moved(trials: Sequence[FrozenTrial]) -> bool:
    """Has the completed re-check moved the study to another size than the one it was on?
    Judged on the trials up to the re-check's last, so that every controller of the study
    reads the same answer whatever has run since."""
    rechecks = [t for t in trials if stage_of(t) == RECHECK]
    if not rechecks or any(not t.state.is_finished() for t in rechecks):
        return False
    first, last = min(t.number for t in rechecks), max(t.number for t in rechecks)
    before = best_trial([t for t in trials if t.number < first])
    after = home_trial([t for t in trials if t.number <= last])
    return before is not None and after is not None and size_of(before) != size_of(after)


def unfit_sizes(trials: Sequence[FrozenTrial]) -> set[int]:
    """The sizes the re-check skips: every launch of theirs failed for memory at a
    ``gpu_memory_utilization`` at least the best point's."""
    best = best_trial(trials)
    if best is None:
        return set()
    util = float(engine_value(best, "gpu_memory_utilization") or 0.0)
    by_size: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        if t.state.is_finished():
            by_size.setdefault(size_of(t), []).append(t)
    return {
        size
        for size, ts in by_size.items()
        if size != size_of(best)
        and all(
            failure_class_of(t) in _NO_ROOM
            and float(engine_value(t, "gpu_memory_utilization") or 0.0) >= util
            for t in ts
        )
    }
