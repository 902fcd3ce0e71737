"""How a configuration is measured in a study's mode, once for every caller: the plan a
study's config sets (:class:`LevelPlan`) and the one function that runs it on a started
runner (:func:`measure`). slo-capacity: the capacity search on the lattice
(docs/tuning.md#1-the-capacity-lattice); fixed-rate and offline: one level at 1.0x
(docs/method.md). Trials, validation runs, out-of-study re-measurement and the baseline's
capacity probe all call :func:`measure`; what each adds (storage, events, its own verdict)
it does around the call, through ``on_start`` and ``on_level``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from autotune.config import StudyConfig
from autotune.errors import ClientLimitError
from autotune.failures import FailureMatch
from autotune.loadgen.client_limit import host_limit_line
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.tuning.measure.capacity import LEAN, CapacityResult, CapacitySearch, Lattice
from autotune.tuning.measure.early_stop import rule_of
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import EarlyStopping, Redrawable, Runner
from autotune.tuning.measure.scoring import LevelScore, Slo, score_level, worst_slo_margin
from autotune.workload.core import Workload
from autotune.workload.sustain import sustain

__all__ = [
    "SETTLE_STEPS_BELOW",
    "LevelPlan",
    "Measured",
    "MeasuredLevel",
    "SettleBar",
    "lattice_of",
    "measure",
    "only_overlength",
]

# called before each level with its load scale: the progress callback for the level, if any
OnStart = Callable[[float], Callable[[ProgressSnapshot], None] | None]


def lattice_of(cfg: StudyConfig, resolution: float | None = None, stride: int = 1) -> Lattice:
    """The capacity lattice of ``cfg`` (``resolution``: another step than the study's;
    ``stride``: every stride-th of its points)."""
    st = cfg.strategy
    step = st.capacity_resolution if resolution is None else resolution
    return Lattice(st.capacity_low, st.capacity_high, step, stride)


@dataclass(frozen=True)
class LevelPlan:
    """What measuring one configuration means in a study: derived from its config once."""

    capacity: bool  # slo-capacity: the lattice search; else one level at 1.0x
    slo: Slo
    latency_slos: bool  # offline studies judge no latency SLO (docs/method.md)
    preemption_constraint: bool
    lattice: Lattice
    max_levels: int  # the capacity search's safety cap
    early_stop: StopRule | None  # what the runner stops a level by (None: full replays)
    # the sample looped until a level lasts this many engine seconds at its load and holds
    # this many requests (0: no minimum; docs/tuning.md#13-level-length)
    min_level_s: float = 0.0
    min_level_requests: int = 0
    # re-measure the capacity search's two boundary points to a majority even when its runs
    # never disagreed (docs/tuning.md#1-the-capacity-lattice, "Noise"); False: only then
    confirm_capacity: bool = False
    # bisection's probe in a bracket (CapacitySearch.lean): above the middle where a failed
    # level costs less than a held one, which early stop makes so
    lean: float = 0.5

    @classmethod
    def of(
        cls,
        cfg: StudyConfig,
        *,
        resolution: float | None = None,
        max_levels: int | None = None,
        stride: int = 1,
    ) -> LevelPlan:
        """The plan of ``cfg``'s trials; ``resolution`` and ``max_levels`` override the
        strategy's (a stricter re-measurement, docs/tuning.md#5-re-measurement-and-ground-truth),
        ``stride`` keeps every stride-th point of the lattice (a validation run's)."""
        return cls(
            capacity=cfg.mode == "slo-capacity",
            slo=Slo.of(cfg.slo),
            latency_slos=cfg.mode != "offline",
            preemption_constraint=cfg.telemetry.preemption_constraint,
            lattice=lattice_of(cfg, resolution, stride),
            max_levels=cfg.strategy.capacity_levels if max_levels is None else max_levels,
            early_stop=rule_of(cfg),
            min_level_s=cfg.strategy.min_level_s,
            min_level_requests=cfg.strategy.min_level_requests,
            # a real server's runs differ run to run; the simulators' do not, so confirming
            # there would spend two identical levels (docs/tuning.md#1-the-capacity-lattice)
            confirm_capacity=cfg.worker.kind == "vllm",
            lean=LEAN if rule_of(cfg) is not None else 0.5,
        )

    @classmethod
    def probe(cls, cfg: StudyConfig) -> LevelPlan:
        """The baseline's capacity probe: a capacity search under the SLOs whatever the
        mode, without the preemption constraint, on full replays."""
        plan = cls.of(cfg)
        return dataclasses.replace(
            plan, capacity=True, latency_slos=True, preemption_constraint=False, early_stop=None
        )


# The settle point lies this many lattice steps below the best capacity so far. At the best's
# own point: a trial that ties the best costs two levels (its point held, the next one up
# failed) and is measured exactly; one step lower bought no quality and cost two more levels
# per near tie (docs/tuning.md#14-settling-losing-trials)
SETTLE_STEPS_BELOW = 0


@dataclass(frozen=True)
class SettleBar:
    """Where a trial is settled (docs/tuning.md#14-settling-losing-trials): the best
    capacity so far (a load scale), the trial that holds it, and the server's noise band
    (percent; None: not measured yet, one lattice step stands in for it)."""

    scale: float
    against: int
    band_pct: float | None = None

    def band(self, lattice: Lattice) -> float:
        """The noise band in percent: the server's, or one lattice step until measured."""
        return self.band_pct if self.band_pct is not None else 100 * lattice.resolution

    def index(self, lattice: Lattice) -> int:
        """The settle point: the lattice point a settled trial is measured at first."""
        return lattice.index(self.scale) - SETTLE_STEPS_BELOW

    def first_run_widening(self, lattice: Lattice) -> float:
        """The factor the settle point's first run widens the study's stop rule by: it stops
        only past the noise band (docs/tuning.md#14-settling-losing-trials)."""
        return 1 + self.band(lattice) / 100

    def near(self, ls: LevelScore, lattice: Lattice) -> bool:
        """A failure by less than the noise: its worst violation (normalized: 0.02 is 2 %
        over a limit) is below the band. A stopped level's violation is a lower bound, so
        the settle point's first run stops only once it is past the band
        (:func:`measure`)."""
        miss = max(ls.violations.values(), default=0.0)
        return not ls.feasible and 0 < 100 * miss < self.band(lattice)


@dataclass(frozen=True)
class MeasuredLevel:
    """One level as measured: its place in the run, the outcome, the verdict, and the
    worker's death if the worker died during it."""

    index: int
    outcome: LevelOutcome
    score: LevelScore
    death: FailureMatch | None


@dataclass(frozen=True)
class Measured:
    levels: tuple[MeasuredLevel, ...]
    capacity: CapacityResult | None  # the search's result (None: one-level modes)
    death: FailureMatch | None  # the worker died: the last level is the one it died in

    @property
    def scores(self) -> list[LevelScore]:
        return [lv.score for lv in self.levels]

    @property
    def level(self) -> MeasuredLevel:
        """A one-level mode's level: the last one measured. There can be two: a
        client-limited level is run once more, and the re-run is the one that counts
        (docs/loadgen.md#5-client-limited-levels)."""
        return self.levels[-1]


async def measure(
    runner: Runner,
    workload: Workload,
    plan: LevelPlan,
    *,
    hint: float | None = None,
    settle: SettleBar | None = None,
    climb: int = 1,
    on_start: OnStart | None = None,
    on_level: Callable[[MeasuredLevel], None] | None = None,
) -> Measured:
    """Measure the configuration ``runner`` started: one level at 1.0x, or the capacity
    search from ``hint`` (None: from the lattice's ends; ``climb``: its first step up from a
    held hint, :class:`CapacitySearch`), or settled at ``settle``
    (docs/tuning.md#14-settling-losing-trials). ``on_level`` sees each level as it is
    scored; the run ends at a level the worker died in, or (search) one whose requests are
    too long for max_model_len and nothing else is wrong."""
    lattice = plan.lattice
    search = (
        CapacitySearch(
            lattice,
            plan.max_levels,
            hint,
            confirm=plan.confirm_capacity,
            settle=settle.index(lattice) if settle is not None else None,
            climb=climb,
            lean=plan.lean,
        )
        if plan.capacity
        else None
    )
    # a settle point measured again after a near miss gets fresh noise where the runner's
    # noise is seeded (it would replay the same floats, docs/tuning.md#2-common-random-numbers)
    redraw = runner.redraw if isinstance(runner, Redrawable) else None
    levels: list[MeasuredLevel] = []
    death: FailureMatch | None = None
    # a client-limited level's place and load, run once more
    # (docs/loadgen.md#5-client-limited-levels)
    rerun: tuple[int | None, float] | None = None
    while True:
        k: int | None = None
        if rerun is not None:
            k, scale = rerun
        elif search is None:
            if levels:
                break
            scale = 1.0
        else:
            k = search.next_index()
            if k is None:
                break
            scale = lattice.scale(k)
            if redraw is not None and search.settle is not None:
                redraw(len(search.runs.get(k, [])) if k == search.settle else 0)
        progress = on_start(scale) if on_start is not None else None
        # a sample too short for this load is looped (docs/tuning.md#13-level-length)
        wl = sustain(workload, scale, plan.min_level_s, plan.min_level_requests)
        widen = None  # the settle point's first run stops past the noise band
        if settle is not None and search is not None and k == search.settle:
            widen = None if k in search.runs else settle.first_run_widening(lattice)
        with _stopping_past(runner, widen):
            out = await runner.run_level(wl, scale, progress=progress)
        if wl is not workload:
            out = dataclasses.replace(out, sample_requests=len(workload))
        ls = score_level(
            out.metrics,
            plan.slo,
            scale,
            latency_slos=plan.latency_slos,
            preemption_constraint=plan.preemption_constraint,
        )
        death = runner.failure()
        level = MeasuredLevel(len(levels), out, ls, death)
        levels.append(level)
        if on_level is not None:
            on_level(level)
        if ls.client_limit is not None and death is None:  # the figures are the client's
            if rerun is not None:
                raise ClientLimitError(_host_limit(plan, out, levels[-2].score, ls))
            rerun = (k, scale)
            continue  # the search never sees it
        rerun = None
        if search is not None and k is not None:
            near = settle is not None and settle.near(ls, lattice)
            margin = worst_slo_margin(out.metrics, plan.slo) if plan.latency_slos else None
            search.record(k, ls.feasible, near=near, margin=margin)
            if only_overlength(ls) or death is not None:
                search.stop()  # no load helps: too long for max_model_len, or the worker died
    capacity = search.result() if search is not None else None
    return Measured(tuple(levels), capacity, death)


@contextmanager
def _stopping_past(runner: Runner, factor: float | None) -> Iterator[None]:
    """While inside, ``runner`` stops a level only once its latency is past its limits times
    ``factor`` (None: its own rule). A settle point's first run stops by the band
    (docs/tuning.md#14-settling-losing-trials, "Near misses"): a stopped level's p99 is a
    lower bound just past the limit it stopped by, which could not tell a near miss from a
    far one."""
    if factor is None or not isinstance(runner, EarlyStopping):
        yield
        return
    rule = runner.set_early_stop(None)
    runner.set_early_stop(rule.widened(factor) if rule is not None else None)
    try:
        yield
    finally:
        runner.set_early_stop(rule)


def _host_limit(plan: LevelPlan, out: LevelOutcome, first: LevelScore, second: LevelScore) -> str:
    """The line a run stops with when a load was client-limited on its re-run too."""
    assert first.client_limit is not None and second.client_limit is not None
    rate = out.offered_rate
    load = f"{rate:,.4g} req/s" if rate is not None else f"{out.scale:g}x the workload's load"
    advice = "lower strategy.capacity_high" if plan.capacity else "lower the workload's rate"
    return host_limit_line(load, first.client_limit, second.client_limit, advice)


def only_overlength(ls: LevelScore) -> bool:
    """Requests too long for max_model_len and nothing else wrong: no load level helps."""
    others = [v for k, v in ls.violations.items() if k != "overlength_rate"]
    return ls.violations["overlength_rate"] > 0 and all(v <= 0 for v in others)
