"""The capacity search on a started runner (docs/tuning.md#1-the-capacity-lattice), without
storage or events, and the rule that stops it early when no load level can help.
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.tuning.measure.capacity import CapacityResult, CapacitySearch, Lattice
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import Runner
from autotune.tuning.measure.scoring import LevelScore, Slo, score_level
from autotune.workload.core import Workload

__all__ = ["capacity_search", "only_overlength"]


async def capacity_search(
    runner: Runner,
    workload: Workload,
    slo: Slo,
    lattice: Lattice,
    *,
    max_levels: int = 24,
    hint: float | None = None,
    preemption_constraint: bool = False,
    on_level: Callable[[LevelOutcome], None] | None = None,
) -> tuple[CapacityResult, list[LevelScore]]:
    """The lattice capacity search (docs/tuning.md#1-the-capacity-lattice) on a started runner,
    without storage or events: the baseline's capacity probe, the validation runs and the
    benchmarks' re-measurements use exactly the protocol the trials use. ``on_level`` sees
    each level's outcome."""
    search = CapacitySearch(lattice, max_levels, hint)
    levels: list[LevelScore] = []
    while (k := search.next_index()) is not None:
        scale = lattice.scale(k)
        out = await runner.run_level(workload, scale)
        if on_level is not None:
            on_level(out)
        ls = score_level(out.metrics, slo, scale, preemption_constraint=preemption_constraint)
        levels.append(ls)
        search.record(k, ls.feasible)
        if only_overlength(ls) or runner.failure() is not None:
            search.stop()  # no load helps: too long for max_model_len, or the worker died
    return search.result(), levels


def only_overlength(ls: LevelScore) -> bool:
    """Requests too long for max_model_len and nothing else wrong: no load level helps."""
    others = [v for k, v in ls.violations.items() if k != "overlength_rate"]
    return ls.violations["overlength_rate"] > 0 and all(v <= 0 for v in others)
