"""What a study run tells its watcher as it goes: one frozen record per kind of event.

The controller, the trial, the session and the validation phase emit them; the CLI renders
them (``autotune study run``'s progress lines), tests and the nightly job watch them. Trial
numbers are Optuna's. An event from a lane of a parallel run (docs/parallel.md#2-lanes) names
that lane and its devices in ``lane``, so the lanes' interleaved lines can say whose they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.loadgen.level import LevelMetrics
    from autotune.store import RepeatRecord, TrialRecord
    from autotune.tuning.measure.interval import ValidationSummary

__all__ = [
    "Event",
    "Lane",
    "LevelDone",
    "LevelProgress",
    "LevelStart",
    "OnEvent",
    "RunStart",
    "TrialAbandoned",
    "TrialDone",
    "TrialInferred",
    "TrialStart",
    "TwinRound",
    "ValidationDone",
    "ValidationRunDone",
    "ValidationRunStart",
    "ValidationSettledEarly",
    "ValidationStart",
    "Waiting",
    "WorkerDied",
    "WorkerFailed",
    "on_lane",
]


@dataclass(frozen=True)
class Lane:
    """The lane of a parallel run an event comes from, and its devices."""

    index: int
    devices: str | None


@dataclass(frozen=True)
class _OfTrial:
    """An event of one trial; ``lane`` set in a parallel run."""

    number: int
    lane: Lane | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class RunStart:
    """The run's plan: ``planned`` trials, ``done`` of them complete; what dead runs left and
    how it was fixed (``recovered``); the lanes' devices in a parallel run."""

    planned: int
    done: int
    timeout_s: float | None
    recovered: tuple[str, ...] = ()
    lanes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Waiting:
    """Nothing to claim until other controllers' (or lanes') running trials complete."""

    reason: str
    running: int


@dataclass(frozen=True)
class TrialAbandoned(_OfTrial):
    """A claimed trial given up and queued again; ``line`` says why."""

    line: str


@dataclass(frozen=True)
class TrialStart(_OfTrial):
    """``position``: (k, n), the k-th complete trial of the n the plan holds."""

    stage: str
    engine_args: Mapping[str, Any]
    position: tuple[int, int] | None


@dataclass(frozen=True)
class TrialInferred(_OfTrial):
    """The trial's levels are a measured twin's: no worker starts
    (docs/tuning.md#14-settling-losing-trials, "A limit the engine never reached")."""

    line: str


@dataclass(frozen=True)
class LevelStart(_OfTrial):
    scale: float


@dataclass(frozen=True)
class LevelProgress(_OfTrial):
    """A live replay's counts so far (HTTP runners)."""

    scale: float
    sent: int
    planned: int
    completed: int
    failed: int
    p99_ttft_ms: float | None


@dataclass(frozen=True)
class LevelDone(_OfTrial):
    scale: float
    offered_rate: float | None
    feasible: bool
    metrics: LevelMetrics
    violations: list[str]


@dataclass(frozen=True)
class WorkerFailed(_OfTrial):
    """The worker did not start."""

    failure_class: str
    message: str


@dataclass(frozen=True)
class WorkerDied(_OfTrial):
    """The worker died (or hung) under load: the level stopped, its partial results kept."""

    scale: float
    failure_class: str
    message: str


@dataclass(frozen=True)
class TrialDone(_OfTrial):
    stage: str
    objective: float
    feasible: bool
    failure_class: str | None
    capacity_scale: float | None
    capacity_status: str | None
    constraints: Mapping[str, float]
    mode: str
    record: TrialRecord


@dataclass(frozen=True)
class ValidationStart:
    planned: int
    pending: int
    # runners-up the study already told from the best, not re-measured (when just planned)
    told_apart: tuple[str, ...] = ()


@dataclass(frozen=True)
class ValidationRunStart:
    repeat: int
    trial: int


@dataclass(frozen=True)
class ValidationRunDone:
    """One re-measurement done: ``done`` of ``planned`` runs."""

    repeat: int
    trial: int
    role: str
    done: int
    planned: int
    result: RepeatRecord  # the run's record, its results set
    mode: str


@dataclass(frozen=True)
class ValidationSettledEarly:
    """The early look settled the verdict (docs/tuning.md#7-validation, "Stopping early"):
    ``repeats`` of ``planned`` repeats ran, ``dropped`` runs were not needed; ``passed``: the
    rivals whose intervals still overlapped the recommended config's (``chosen``) but never
    measured above it on a shared sample; ``tied``: those that beat the baseline too, with a
    mean gain within the recommended config's interval."""

    repeats: int
    planned: int
    dropped: int
    chosen: int | None = None
    passed: tuple[int, ...] = ()
    tied: tuple[int, ...] = ()


@dataclass(frozen=True)
class TwinRound:
    """The twin strategy refitted and screened (docs/tuning.md#15-the-twin-strategy): the
    fit's median error per metric, configs screened, CPU seconds, and the next config with
    its predicted gain over the best measured one, or why the search stops; the measured
    levels the fit replayed, of those it could (fewer when the round's CPU ran short)."""

    residual_pct: Mapping[str, float]
    screened: int
    cpu_s: float
    next_args: Mapping[str, Any] | None
    predicted_gain_pct: float | None
    stop: str | None
    levels_fitted: int = 0
    levels: int = 0


@dataclass(frozen=True)
class ValidationDone:
    summary: ValidationSummary


Event = (
    RunStart
    | Waiting
    | TrialAbandoned
    | TrialStart
    | TrialInferred
    | LevelStart
    | LevelProgress
    | LevelDone
    | WorkerFailed
    | WorkerDied
    | TrialDone
    | TwinRound
    | ValidationStart
    | ValidationRunStart
    | ValidationRunDone
    | ValidationSettledEarly
    | ValidationDone
)
OnEvent = Callable[[Event], None]


def on_lane(on_event: OnEvent | None, lane: int, devices: str | None) -> OnEvent | None:
    """A parallel run's trial events name the lane and the devices they come from."""
    if on_event is None:
        return None
    tag = Lane(lane, devices)

    def emit(e: Event) -> None:
        on_event(dataclasses.replace(e, lane=tag) if isinstance(e, _OfTrial) else e)

    return emit
