"""What every trial runner is (docs/architecture.md): the :class:`Runner` protocol a trial,
a validation run and a re-measurement drive (start a worker with engine args, replay load
levels, stop it), what starting reports (:class:`StartInfo`), and the helpers both runners
use to turn a replayed level into a :class:`LevelOutcome`. The runners themselves:
:mod:`autotune.tuning.measure.virtual_runner` (``sim-virtual``) and
:mod:`autotune.tuning.measure.http_runner` (``sim``, ``vllm``); the study's one:
:func:`autotune.tuning.measure.runner_factory.make_runner`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from autotune.failures import FailureMatch
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.store import WorkerUsage
from autotune.telemetry import diagnose
from autotune.telemetry.summary import LevelTelemetry
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.workload.core import Workload

__all__ = [
    "EarlyStopping",
    "Keepable",
    "Redrawable",
    "Runner",
    "StartInfo",
    "offered_rate",
    "with_diagnosis",
]


@dataclass
class StartInfo:
    command: str
    argv: list[str]
    startup_s: float
    kv_cache_tokens: int | None
    max_concurrency: float | None


class Runner(Protocol):
    kind: str

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo: ...

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome: ...

    def failure(self) -> FailureMatch | None: ...

    async def stop(self) -> None: ...

    def usage(self) -> WorkerUsage | None:
        """What the last worker cost on its devices, from its launch to :meth:`stop`
        (docs/cost.md#1-what-is-counted); None before any start."""
        ...


def offered_rate(wl: Workload, scale: float) -> float | None:
    """The arrival rate of ``wl`` run at ``scale`` (requests/s; None without timed arrivals)."""
    t = wl.arrivals()
    if t is None or len(t) < 2 or t[-1] <= 0:
        return None
    return float(len(t) / t[-1] * scale)


def with_diagnosis(
    out: LevelOutcome, tel: LevelTelemetry | None, mns: int, mnbt: int
) -> LevelOutcome:
    """Attach the level's telemetry and the seed guide's bottleneck diagnosis
    (docs/method.md#3-reading-the-bottleneck)."""
    if tel is not None:
        out.telemetry = tel
        out.diagnosis = diagnose(tel, max_num_seqs=mns, max_num_batched_tokens=mnbt)
        if "preemptions" in tel.counters:  # the server's counter delta over the level
            out.metrics = out.metrics.with_preemptions(tel.counters["preemptions"])
    return out


@runtime_checkable
class Redrawable(Protocol):
    """A runner whose noise is seeded (``sim-virtual``, docs/tuning.md#2-common-random-numbers):
    ``redraw(k)`` makes its next levels draw jitter stream ``k`` (0: the study's own) until
    it stops. Without it a repeat of a level there would replay the same floats."""

    def redraw(self, k: int) -> None: ...


@runtime_checkable
class EarlyStopping(Protocol):
    """A runner that stops a level early (docs/tuning.md#10-early-stop-inside-a-level):
    ``set_early_stop(rule)`` makes its next levels stop by ``rule`` (None: replay to the
    end) and returns the rule it stopped by until then."""

    def set_early_stop(self, rule: StopRule | None) -> StopRule | None: ...


@runtime_checkable
class Keepable(Protocol):
    """A runner whose started worker can serve several validation runs of one config in a
    row (docs/tuning.md#7-validation, "One worker for a block of runs").

    ``reseed(seed)``: the next levels draw the noise a worker started for ``seed`` would,
    and the answer says whether they can (False: the worker's noise was fixed at its
    launch, so the next run needs a worker of its own). ``split_usage()``: what the running
    worker cost since its launch or the previous split (the start-up goes to the first
    part); it keeps running, and :meth:`Runner.usage` after the stop is what is left, so the
    parts add up to its whole lifetime (docs/cost.md#1-what-is-counted)."""

    def reseed(self, seed: int) -> bool: ...

    def split_usage(self) -> WorkerUsage | None: ...
