"""A study's device time before it runs, and its budget (docs/cost.md#3-the-plan-and-the-budget).

:func:`estimate` prices the plan `study create` prints: each trial is a start-up (the modelled
start of vLLM, docs/cost.md#2-the-start-up-model) and the levels of one capacity search (the
search the product runs, played against the baseline's capacity as ``study create``
simulated it, else against capacities spread over the lattice) or one level;
a trial after the baseline that is settled (docs/tuning.md#14-settling-losing-trials) is
priced at :data:`SETTLE_LEVELS` levels at those capacities instead; the validation phase is
the noise re-runs and its runs, each a search from the config's capacity
(:data:`VALIDATION_LEVELS` levels there) or, with ``strategy.validate.from_capacity`` off,
a full search, from every planned run down to the fewest the phase can take (the best config
and the baseline up to the early look). A level lasts its sample's span at its
load, looped to the level minimums (docs/tuning.md#13-level-length). A closed loop's length
depends on the server, so only its minimum is known: the estimate is then a lower bound.

:func:`over_budget` is the check a lane makes before it claims a trial when
``strategy.gpu_hours`` is set: what the study's workers have cost so far, the trials running
now and the next one, and the validation phase after them, must fit; once trials are counted
they set the price. Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import StudyConfig
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.capacity import CapacitySearch
from autotune.tuning.measure.cost import StudyCost
from autotune.tuning.measure.early_look import look_after
from autotune.tuning.measure.level_plan import LevelPlan
from autotune.tuning.measure.noise import NOISE_RUNS
from autotune.tuning.measure.usage import sim_startup_s
from autotune.tuning.measure.validation_plan import worker_starts
from autotune.tuning.search.parallelism import tp_candidates
from autotune.workers.devices import devices_held
from autotune.workload.core import Workload
from autotune.workload.sustain import copies_needed

__all__ = [
    "CAPACITY_POSITIONS",
    "SETTLE_LEVELS",
    "SIMULATED_CAPACITY",
    "VALIDATION_LEVELS",
    "CostEstimate",
    "estimate",
    "level_seconds",
    "over_budget",
    "search_scales",
    "simulated_capacity",
]


@dataclass(frozen=True)
class CostEstimate:
    """The planned device time (GPU-seconds): ``trial_gpu_s`` for one trial after the
    baseline, ``full_gpu_s`` for a full capacity search (the baseline's, a validation run's;
    None: the same as a trial), ``search_gpu_s`` for the planned trials and the noise
    re-runs, ``validation_gpu_s`` for the validation phase. ``lower_bound``: some levels'
    length depends on the server (a closed loop), so only their minimum is in."""

    trials: int
    trial_gpu_s: float
    noise_gpu_s: float  # the baseline's noise re-runs, once per study
    validation_runs: int  # each priced as a full search
    lower_bound: bool
    full_gpu_s: float | None = None
    # a validation run's price (None: a full search's)
    validation_run_gpu_s: float | None = None
    # a study that searches the parallelism: the size its trials are priced at
    tp_size: int | None = None
    # the validation phase at its fewest runs: the best config and the baseline only, up to
    # the early look (None: as many as the plan; docs/cost.md#3-the-plan-and-the-budget)
    validation_least_gpu_s: float | None = None

    @property
    def full(self) -> float:
        """A full search's price: the baseline's."""
        return self.trial_gpu_s if self.full_gpu_s is None else self.full_gpu_s

    @property
    def validation_run(self) -> float:
        return self.full if self.validation_run_gpu_s is None else self.validation_run_gpu_s

    @property
    def validation_gpu_s(self) -> float:
        return self.validation_runs * self.validation_run

    @property
    def search_gpu_s(self) -> float:
        later = max(self.trials - 1, 0) * self.trial_gpu_s
        return (self.full if self.trials else 0.0) + later + self.noise_gpu_s

    @property
    def gpu_hours(self) -> float:
        """The plan at its most: every validation run it plans."""
        return (self.search_gpu_s + self.validation_gpu_s) / 3600.0

    @property
    def least_validation_gpu_s(self) -> float:
        least = self.validation_least_gpu_s
        return self.validation_gpu_s if least is None else min(least, self.validation_gpu_s)

    @property
    def gpu_hours_least(self) -> float:
        """The plan when its validation phase takes its fewest runs."""
        return (self.search_gpu_s + self.least_validation_gpu_s) / 3600.0

    @property
    def text(self) -> str:
        """``about 1.99-2.77 GPU-hours (24 trials of about 3 GPU-minutes, validation
        0.50-1.27)``: the validation phase from its fewest runs to its most, one figure when
        both round alike."""
        about = "at least" if self.lower_bound else "about"
        low, high = self.least_validation_gpu_s / 3600, self.validation_gpu_s / 3600
        total = f"{self.gpu_hours:.2f}"
        validation = f", validation {high:.2f}" if self.validation_gpu_s else ""
        if f"{low:.2f}" != f"{high:.2f}":  # the phase's length hangs on what it measures
            total = f"{self.gpu_hours_least:.2f}-{self.gpu_hours:.2f}"
            validation = f", validation {low:.2f}-{high:.2f}"
        size = "" if self.tp_size is None else f" at TP {self.tp_size}"
        return (
            f"{about} {total} GPU-hours ({self.trials} trials of {about} "
            f"{self.trial_gpu_s / 60:.0f} GPU-minutes{size}{validation})"
        )


def level_seconds(wl: Workload, scale: float, min_s: float, min_n: int) -> tuple[float, bool]:
    """How long a level at ``scale`` replays (engine seconds), and whether that is only its
    minimum (a closed loop, or a sample sent all at once)."""
    times = wl.arrivals()
    span = float(times[-1]) if times is not None and len(times) else 0.0
    if span <= 0:
        return min_s, True
    return copies_needed(wl, scale, min_s, min_n) * span / scale, False


# The workload profile's key for the baseline's capacity as `study create` simulated it (a
# load scale), which places the plan's levels (docs/cost.md#3-the-plan-and-the-budget)
SIMULATED_CAPACITY = "simulated_capacity_scale"


def simulated_capacity(profile: Mapping[str, Any]) -> float | None:
    """The baseline's capacity as ``study create`` simulated it, from a study's workload
    profile (None: not simulated, e.g. a configured peak concurrency or an older study). The
    plan line and the budget both price at it (docs/cost.md#3-the-plan-and-the-budget)."""
    value = profile.get(SIMULATED_CAPACITY)
    return float(value) if isinstance(value, int | float) and value > 0 else None


# Where in the lattice a trial's capacity may lie (fractions of its log range): a search's
# cost hangs on it (a capacity below the middle sends the search to low loads, the slowest
# levels), so a trial is priced as the mean over these (docs/cost.md#3-the-plan-and-the-budget)
CAPACITY_POSITIONS = (0.2, 0.4, 0.6, 0.8)
# Levels of a settled trial, priced at the same capacities: one when it fails the best
# capacity so far, two for a tie, more for a new best (docs/cost.md#3-the-plan-and-the-budget)
SETTLE_LEVELS = 2
# Levels of a validation run that starts at its config's capacity: the capacity and the next
# point up, and the gallop and bisection on the run's lattice to where a fresh sample moved it
# (2 to 6 on the quickstart, 3.6 on average; docs/cost.md#3-the-plan-and-the-budget)
VALIDATION_LEVELS = 4


def search_scales(plan: LevelPlan, position: float = 0.5) -> list[float]:
    """The loads a capacity search measures when the capacity sits at ``position`` (0: the
    lattice's bottom, 1: its top, in log scale); one level at 1.0x outside slo-capacity."""
    if not plan.capacity:
        return [1.0]
    lattice = plan.lattice
    capacity = lattice.low * (lattice.high / lattice.low) ** position
    search = CapacitySearch(
        lattice, plan.max_levels, None, confirm=plan.confirm_capacity, lean=plan.lean
    )
    scales = []
    while (k := search.next_index()) is not None:
        s = lattice.scale(k)
        scales.append(s)
        search.record(k, s <= capacity)
    return scales


def estimate(
    cfg: StudyConfig,
    model: ModelProfile,
    wl: Workload,
    trials: int,
    tp_size: int | None = None,
    capacity: float | None = None,
) -> CostEstimate:
    """The device time of ``trials`` trials of ``cfg`` on the workload sample ``wl`` and of
    its validation phase. A study that searches the parallelism prices its trials at
    ``tp_size`` devices (default: the largest size): the stages after the parallelism stage
    run inside the size it chose, unknown before it has run
    (docs/cost.md#3-the-plan-and-the-budget). ``capacity``: the baseline's capacity as
    ``study create`` simulated it (a load scale), where the levels are priced; None: over
    :data:`CAPACITY_POSITIONS`."""
    plan = LevelPlan.of(cfg)
    st = cfg.strategy
    args = dict(cfg.worker.static_args)
    devices = devices_held(args, cfg.worker.gpus)
    if cfg.search.parallelism is not None:
        tp_size = tp_size or max(tp_candidates(model, cfg.search.parallelism))
        devices = max(devices, tp_size)
    else:
        tp_size = None
    startup = sim_startup_s(model, args)
    positions = CAPACITY_POSITIONS if plan.capacity else (0.5,)
    # the baseline's capacity as `study create` simulated it, where a capacity search's levels
    # are priced (docs/cost.md#3-the-plan-and-the-budget)
    simulated = capacity if plan.capacity and capacity is not None and capacity > 0 else None
    if simulated is not None:
        lat = plan.lattice
        positions = (min(max(math.log(simulated / lat.low) / math.log(lat.high / lat.low), 0), 1),)
    searches = [
        [
            level_seconds(wl, s, st.min_level_s, st.min_level_requests)
            for s in search_scales(plan, p)
        ]
        for p in positions
    ]
    search_s = sum(s for levels in searches for s, _ in levels) / len(searches)
    lower = any(low for levels in searches for _, low in levels)
    full = devices * (startup + search_s)
    v = st.validate_
    runs = (v.top_k + 1) * cfg.validation_repeats if v.enabled else 0
    # a block of runs shares one worker (docs/tuning.md#7-validation) except on a `sim`
    # server, whose noise is fixed at launch: each run is charged its share of the starts
    starts = (
        runs if cfg.worker.kind == "sim" else worker_starts(cfg.validation_repeats, v.top_k + 1)
    )
    run_startup = startup * starts / runs if runs else startup
    # at its fewest: the best config and the baseline (a runner-up the study told apart, or
    # one the runs could not rank, is not run), up to the early look when it may settle the
    # verdict (docs/tuning.md#7-validation)
    look = look_after(cfg.validation_repeats) if v.stop_early else None
    least_repeats = look or cfg.validation_repeats
    least_runs = min(2 * least_repeats, runs)
    least_starts = (
        least_runs
        if cfg.worker.kind == "sim"
        else worker_starts(least_repeats, min(2, v.top_k + 1))
    )
    trial, run = full, devices * (run_startup + search_s)
    if plan.capacity:
        lat = plan.lattice
        at = [
            level_seconds(wl, lat.low * (lat.high / lat.low) ** p,
                          st.min_level_s, st.min_level_requests)[0]
            for p in positions
        ]  # fmt: skip
        at_capacity = sum(at) / len(at)  # one level at a capacity
        if st.settle:
            trial = devices * (startup + SETTLE_LEVELS * at_capacity)
        if st.validate_.from_capacity:
            run = devices * (run_startup + VALIDATION_LEVELS * at_capacity)
    # the baseline's boundary level twice more, once per study (the server's noise), at its
    # simulated capacity when there is one
    noise_at = simulated if simulated is not None else 1.0
    boundary = level_seconds(wl, noise_at, st.min_level_s, st.min_level_requests)[0]
    noise = devices * (NOISE_RUNS - 1) * boundary
    run_levels = run - devices * run_startup  # one run's replay, without its start-up share
    least = devices * startup * least_starts + least_runs * run_levels if runs else None
    return CostEstimate(trials, trial, noise, runs, lower, full, run, tp_size, least)


def over_budget(
    cfg: StudyConfig,
    est: CostEstimate,
    spent: StudyCost,
    running: int,
    full_gpu_s: float | None = None,
) -> bool:
    """Whether one more trial would pass ``strategy.gpu_hours``: what the study's workers
    cost so far (``spent``), then ``running`` trials in flight and the next one, and the
    validation phase after them. Once trials are counted, a trial's price is their mean cost
    (the plan's estimate leaves out early stop and guesses where capacities lie). Validation
    runs are priced as the plan's, except full searches (``strategy.validate.from_capacity``
    off): as the baseline's counted one (``full_gpu_s``). False without a budget, and for
    the first trial, the baseline (docs/method.md: a baseline before any change)."""
    budget = cfg.strategy.gpu_hours
    if budget is None:
        return False
    if not spent.trials and not running:
        return False  # the baseline always runs: no change is judged without it
    price = spent.trials_gpu_s / spent.trials if spent.trials else est.trial_gpu_s
    noise = 0.0 if spent.trials else est.noise_gpu_s  # the baseline's, counted with it
    run = est.validation_run
    if not cfg.strategy.validate_.from_capacity and full_gpu_s is not None:
        run = full_gpu_s
    need = spent.gpu_s + (running + 1) * price + est.validation_runs * run + noise
    return need > budget * 3600.0
