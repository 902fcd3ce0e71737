"""A study's device time before it runs, and its budget (docs/cost.md#3-the-plan-and-the-budget).

:func:`estimate` prices the plan `study create` prints: each trial is a start-up (the modelled
start of vLLM, docs/cost.md#2-the-start-up-model) and the levels of one capacity search (the
search the product runs, played against a capacity in the middle of the lattice) or one level;
the validation phase is the noise re-runs and its runs. A level lasts its sample's span at its
load, looped to the level minimums (docs/tuning.md#13-level-length). A closed loop's length
depends on the server, so only its minimum is known: the estimate is then a lower bound.

:func:`over_budget` is the check a lane makes before it claims a trial when
``strategy.gpu_hours`` is set: what the study's workers have cost so far, the trials running
now and the next one, and the validation phase after them, must fit. Pure: values in, values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config import StudyConfig
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.capacity import CapacitySearch
from autotune.tuning.measure.level_plan import LevelPlan
from autotune.tuning.measure.noise import NOISE_RUNS
from autotune.tuning.measure.usage import sim_startup_s
from autotune.workers.devices import devices_held
from autotune.workload.core import Workload
from autotune.workload.sustain import copies_needed

__all__ = ["CostEstimate", "estimate", "level_seconds", "over_budget", "search_scales"]


@dataclass(frozen=True)
class CostEstimate:
    """The planned device time (GPU-seconds): ``trial_gpu_s`` for one trial, ``search_gpu_s``
    for the planned trials, ``validation_gpu_s`` for the validation phase. ``lower_bound``:
    some levels' length depends on the server (a closed loop), so only their minimum is in."""

    trials: int
    trial_gpu_s: float
    validation_gpu_s: float
    lower_bound: bool

    @property
    def search_gpu_s(self) -> float:
        return self.trials * self.trial_gpu_s

    @property
    def gpu_hours(self) -> float:
        return (self.search_gpu_s + self.validation_gpu_s) / 3600.0

    @property
    def text(self) -> str:
        """``about 4.8 GPU-hours (24 trials of about 9 min, validation 2.1 GPU-hours)``."""
        about = "at least" if self.lower_bound else "about"
        validation = (
            f", validation {self.validation_gpu_s / 3600:.2f}" if self.validation_gpu_s else ""
        )
        return (
            f"{about} {self.gpu_hours:.2f} GPU-hours ({self.trials} trials of {about} "
            f"{self.trial_gpu_s / 60:.0f} GPU-minutes{validation})"
        )


def level_seconds(wl: Workload, scale: float, min_s: float, min_n: int) -> tuple[float, bool]:
    """How long a level at ``scale`` replays (engine seconds), and whether that is only its
    minimum (a closed loop, or a sample sent all at once)."""
    times = wl.arrivals()
    span = float(times[-1]) if times is not None and len(times) else 0.0
    if span <= 0:
        return min_s, True
    return copies_needed(wl, scale, min_s, min_n) * span / scale, False


def search_scales(plan: LevelPlan) -> list[float]:
    """The loads a capacity search measures when the capacity sits in the middle of the
    lattice (one level at 1.0x outside slo-capacity)."""
    if not plan.capacity:
        return [1.0]
    lattice = plan.lattice
    middle = math.sqrt(lattice.low * lattice.high)
    search = CapacitySearch(lattice, plan.max_levels, None, confirm=plan.confirm_capacity)
    scales = []
    while (k := search.next_index()) is not None:
        s = lattice.scale(k)
        scales.append(s)
        search.record(k, s <= middle)
    return scales


def estimate(cfg: StudyConfig, model: ModelProfile, wl: Workload, trials: int) -> CostEstimate:
    """The device time of ``trials`` trials of ``cfg`` on the workload sample ``wl`` and of
    its validation phase."""
    plan = LevelPlan.of(cfg)
    st = cfg.strategy
    args = dict(cfg.worker.static_args)
    devices = devices_held(args, cfg.worker.gpus)
    startup = sim_startup_s(model, args)
    floors = [
        level_seconds(wl, s, st.min_level_s, st.min_level_requests) for s in search_scales(plan)
    ]
    search_s = sum(s for s, _ in floors)
    lower = any(low for _, low in floors)
    trial = devices * (startup + search_s)
    v = st.validate_
    validation = 0.0
    if v.enabled:
        boundary = level_seconds(wl, 1.0, st.min_level_s, st.min_level_requests)[0]
        validation = devices * (NOISE_RUNS - 1) * boundary
        validation += (v.top_k + 1) * cfg.validation_repeats * trial
    return CostEstimate(trials, trial, validation, lower)


def over_budget(cfg: StudyConfig, est: CostEstimate, spent_gpu_s: float, running: int) -> bool:
    """Whether one more trial would pass ``strategy.gpu_hours``: ``spent_gpu_s`` (what the
    study's workers cost so far), ``running`` trials in flight and the next one at the
    estimate's price each, and the validation phase after them. False without a budget."""
    budget = cfg.strategy.gpu_hours
    if budget is None:
        return False
    need = spent_gpu_s + (running + 1) * est.trial_gpu_s + est.validation_gpu_s
    return need > budget * 3600.0
