"""A study's device time, summed from what each worker cost (docs/cost.md#1-what-is-counted):
the trials' workers (failed attempts and retries included) and the validation runs'. Pure:
stored records in, a :class:`StudyCost` out; ``study show``, ``study best``, the export, the
report and the dashboard all print its :attr:`StudyCost.text`, and ``strategy.gpu_hours``
is checked against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune.store import RepeatRecord, TrialRecord, WorkerUsage

__all__ = ["StudyCost", "study_cost"]


@dataclass(frozen=True)
class StudyCost:
    """Device-seconds of a study's workers, and what they were spent on.

    ``trials_gpu_s`` and ``validation_gpu_s`` split the total; ``replayed_s`` and
    ``startup_s`` are worker seconds (not times devices) of replayed load and of start-ups;
    ``worker_starts`` counts launches (every trial's; a validation run's unless it ran on the
    worker the run before kept, docs/tuning.md#7-validation, which charges no start-up);
    ``modelled``: some worker was simulated, so its
    start-up is modelled (docs/cost.md#2-the-start-up-model); ``uncounted``: records with a
    worker but no cost (stored before costs were), left out of every figure; ``inferred``:
    trials that took a measured twin's levels and started no worker, costing nothing
    (docs/tuning.md#14-settling-losing-trials), not among ``trials``.
    """

    trials_gpu_s: float
    validation_gpu_s: float
    replayed_s: float
    startup_s: float
    trials: int
    validation_runs: int
    modelled: bool
    uncounted: int
    validation_starts: int
    inferred: int = 0

    @property
    def worker_starts(self) -> int:
        return self.trials + self.validation_starts

    @property
    def gpu_s(self) -> float:
        return self.trials_gpu_s + self.validation_gpu_s

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / 3600.0

    def to_dict(self) -> dict[str, Any]:
        """The export's ``cost`` (docs/report.md#5-machine-readable-output)."""
        return {
            "gpu_hours": self.gpu_hours,
            "gpu_s": self.gpu_s,
            "trials_gpu_s": self.trials_gpu_s,
            "validation_gpu_s": self.validation_gpu_s,
            "replayed_s": self.replayed_s,
            "startup_s": self.startup_s,
            "worker_starts": self.worker_starts,
            "trials": self.trials,
            "validation_runs": self.validation_runs,
            "validation_starts": self.validation_starts,
            "startup_modelled": self.modelled,
            "uncounted": self.uncounted,
            "inferred": self.inferred,
            "text": self.text,
        }

    @property
    def text(self) -> str:
        """``cost: 2.92 GPU-hours (24 trials 1.57, validation 1.35; 2.19 h replayed, 39 worker
        starts, 0.73 h start-up; start-up modelled)``."""
        if not self.worker_starts:
            return "cost: nothing counted yet"
        parts = f"{self.trials + self.inferred} trials {_h(self.trials_gpu_s)}"
        if self.inferred:
            parts += f" ({self.inferred} inferred without a worker)"
        if self.validation_runs:
            parts += f", validation {_h(self.validation_gpu_s)}"
        how = (
            f"{_h(self.replayed_s)} h replayed, {self.worker_starts} worker starts, "
            f"{_h(self.startup_s)} h start-up"
        )
        if self.modelled:
            how += "; start-up modelled"
        if self.uncounted:
            how += f"; {self.uncounted} older records not counted"
        return f"cost: {_h(self.gpu_s)} GPU-hours ({parts}; {how})"


def _h(seconds: float) -> str:
    h = seconds / 3600.0
    return f"{h:.2f}" if h < 10 else f"{h:,.1f}"


def study_cost(trials: Iterable[TrialRecord], repeats: Iterable[RepeatRecord] = ()) -> StudyCost:
    """The cost of ``trials`` (every attempt, as stored) and the validation runs ``repeats``."""
    trials = list(trials)
    inferred = sum(1 for t in trials if t.inferred_from is not None)
    t_usage, t_uncounted = _usages(t for t in trials if t.inferred_from is None)
    v_usage, v_uncounted = _usages(repeats)
    every = t_usage + v_usage
    return StudyCost(
        trials_gpu_s=sum(u.gpu_s for u in t_usage),
        validation_gpu_s=sum(u.gpu_s for u in v_usage),
        replayed_s=sum(u.replayed_s for u in every),
        startup_s=sum(u.worker_startup_s for u in every),
        trials=len(t_usage),
        validation_runs=len(v_usage),
        modelled=any(u.cost_modelled for u in every),
        uncounted=t_uncounted + v_uncounted,
        validation_starts=sum(1 for u in v_usage if u.worker_startup_s > 0),
        inferred=inferred,
    )


def _usages(records: Iterable[TrialRecord | RepeatRecord]) -> tuple[list[WorkerUsage], int]:
    """(the costs of the records with a worker, records that ran but have none)."""
    usages: list[WorkerUsage] = []
    uncounted = 0
    for r in records:
        u = r.usage
        if u is not None:
            usages.append(u)
        elif r.state != "PENDING" and r.started_at is not None:
            uncounted += 1
    return usages, uncounted
