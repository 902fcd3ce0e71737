"""Fake ``Runner``s (the protocol in autotune/tuning/measure/runner_protocol.py) for tests that
drive ``run_trial`` and the controller without a worker.

- :class:`ScriptedRunner`: every call follows a script, so a test can send ``run_trial``
  (autotune/tuning/measure/trial.py) down each of its branches: a start-up failure, a death under
  load, an interrupt in the middle of a level, an over-length stop of the capacity search.
- :class:`NoisyRunner`: each config has a true capacity and a known multiplicative noise,
  for the validation phase (autotune/tuning/measure/validate.py).
- :func:`sim_http_runner`: the real HTTP runner against the simulator's API server (a
  process speaking vLLM's API and /metrics), 10x faster than real time.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autotune.config import StudyConfig
from autotune.failures import FailureClass, FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stop_rule import StopRule
from autotune.store import WorkerUsage
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo
from autotune.workers.sim_worker import SimWorker
from autotune.workload.core import Workload

__all__ = [
    "SIM_VOCAB",
    "KeepableNoisyRunner",
    "NoisyRunner",
    "ScriptedRunner",
    "feasible_up_to",
    "jittered_up_to",
    "sim_http_runner",
]


def feasible_up_to(capacity: float, n: int = 100) -> Callable[[float], LevelMetrics]:
    """Levels that meet the test config's SLOs (p99 TTFT 3 s, TPOT 45 ms) up to ``capacity``
    times the workload's rate and break TTFT above it."""

    def level(scale: float) -> LevelMetrics:
        ok = scale <= capacity
        return LevelMetrics(
            completed=n,
            failed=0,
            duration_s=10.0,
            p99_ttft_ms=500.0 if ok else 9000.0,
            p99_tpot_ms=20.0,
            output_throughput=100.0 * scale,
            request_throughput=4.0 * scale,
        )

    return level


def jittered_up_to(
    capacity: float, seed: int, jitter: float = 0.03
) -> Callable[[float], LevelMetrics]:
    """:func:`feasible_up_to` a capacity drawn afresh for every level, ``capacity`` times a
    uniform factor in ``1 +- jitter`` (a fixed ``seed``): near the capacity a load holds on
    some runs and fails on others, as on a noisy server."""
    rng = random.Random(seed)
    return lambda scale: feasible_up_to(capacity * rng.uniform(1 - jitter, 1 + jitter))(scale)


@dataclass
class ScriptedRunner:
    """A runner whose start, levels and failures follow a script.

    ``start_error``: raised by :meth:`start` (a ``WorkerStartupError`` for a start-up
    failure). ``levels``: the metrics of a level at a scale. ``die_after``: after that many
    levels (0-based index of the level that dies), :meth:`failure` reports ``death``, as a
    worker that died under load does. ``raise_in_level``: (index, exception) raised inside
    that level, as a Ctrl-C or a cancelled task arrives. ``calls`` logs every call.
    """

    kind: str = "sim-virtual"
    start_error: BaseException | None = None
    levels: Callable[[float], LevelMetrics] = field(default_factory=lambda: feasible_up_to(2.0))
    die_after: int | None = None
    death: FailureMatch = field(
        default_factory=lambda: FailureMatch(
            FailureClass.RUNTIME_OOM, "torch.OutOfMemoryError: CUDA out of memory"
        )
    )
    raise_in_level: tuple[int, BaseException] | None = None
    info: StartInfo = field(
        default_factory=lambda: StartInfo("vllm serve fake", ["vllm", "serve"], 1.5, 50_000, 12.0)
    )
    calls: list[tuple[str, Any]] = field(default_factory=list)
    # what each worker reports it cost (docs/cost.md); None: nothing
    cost: WorkerUsage | None = None
    _ran: int = 0

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.calls.append(("start", trial_name))
        if self.start_error is not None:
            raise self.start_error
        return self.info

    async def run_level(
        self, workload: Workload, scale: float, progress: Any = None
    ) -> LevelOutcome:
        index = self._ran
        self._ran += 1
        self.calls.append(("level", scale))
        if self.raise_in_level is not None and self.raise_in_level[0] == index:
            raise self.raise_in_level[1]
        return LevelOutcome(scale, 4.0 * scale, self.levels(scale))

    def failure(self) -> FailureMatch | None:
        if self.die_after is not None and self._ran > self.die_after:
            return self.death
        return None

    async def stop(self) -> None:
        self.calls.append(("stop", None))

    def usage(self) -> WorkerUsage | None:
        return self.cost


class NoisyRunner:
    """Each config (keyed by max_num_seqs) has a true capacity and a known multiplicative
    noise: in a run with jitter seed ``s`` its capacity is ``true * exp(sd * z)``, ``z`` drawn
    from ``(s, config)``. Fixed-rate and offline levels report p99 TTFT and throughput the
    same way. Every start and level is logged."""

    kind = "sim-virtual"

    def __init__(self, seed: int, spec: Mapping[int, tuple[float, float]], log: list[Any]) -> None:
        self.seed, self.spec, self.log = seed, spec, log
        self.key = 0
        self.noise = 1.0

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.key = int(engine_args["max_num_seqs"])
        true, sd = self.spec[self.key]
        z = np.random.default_rng([self.seed, self.key]).standard_normal()
        self.noise = float(true * np.exp(sd * z))
        self.log.append(("start", self.key, trial_name))
        return StartInfo("vllm serve fake", ["vllm"], 0.0, 1000, 10.0)

    async def run_level(
        self, workload: Workload, scale: float, progress: Any = None
    ) -> LevelOutcome:
        self.log.append(("level", self.key, workload.fingerprint()))
        ok = scale <= self.noise
        m = LevelMetrics(
            completed=100,
            failed=0,
            p99_ttft_ms=(1000.0 if ok else 5000.0) if scale != 1.0 else 1500.0 / self.noise,
            p99_tpot_ms=20.0 if scale != 1.0 else 20.0 / self.noise,
            output_throughput=1000.0 * self.noise,
            request_throughput=scale,
        )
        return LevelOutcome(scale, 4.0 * scale, m)

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        self.log.append(("stop", self.key))

    def usage(self) -> WorkerUsage | None:
        return None


class KeepableNoisyRunner(NoisyRunner):
    """A :class:`NoisyRunner` whose started worker serves another run's seed (the
    ``Keepable`` protocol): a reseeded worker draws the noise a fresh one started for that
    seed would, so keeping it changes no figure. ``dies_after``: the worker dies after that
    many levels (its failure is then reported)."""

    def __init__(
        self,
        seed: int,
        spec: Mapping[int, tuple[float, float]],
        log: list[Any],
        dies_after: int | None = None,
    ) -> None:
        super().__init__(seed, spec, log)
        self.running = False
        self.levels, self.dies_after = 0, dies_after

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.running = True
        return await super().start(engine_args, trial_name)

    async def run_level(
        self, workload: Workload, scale: float, progress: Any = None
    ) -> LevelOutcome:
        self.levels += 1
        return await super().run_level(workload, scale, progress)

    def failure(self) -> FailureMatch | None:
        if self.dies_after is not None and self.levels >= self.dies_after:
            return FailureMatch(FailureClass.UNKNOWN, "died")
        return None

    def reseed(self, seed: int) -> bool:
        if not self.running:
            return False
        self.seed = seed
        true, sd = self.spec[self.key]
        z = np.random.default_rng([self.seed, self.key]).standard_normal()
        self.noise = float(true * np.exp(sd * z))
        self.log.append(("reseed", self.key, seed))
        return True

    def split_usage(self) -> WorkerUsage | None:
        return WorkerUsage(1.0, 0.0, 1.0, 1, True) if self.running else None

    async def stop(self) -> None:
        self.running = False
        await super().stop()


# the simulator's API server's vocabulary in these tests (build_workload's vocab_size too)
SIM_VOCAB = 32_000


def sim_http_runner(
    cfg: StudyConfig, workdir: Path, early_stop: StopRule | None = None
) -> HttpRunner:
    """An :class:`HttpRunner` for ``cfg``'s model and hardware on a ``sim`` server in
    ``workdir``, 10x faster than real time, stopping levels by ``early_stop``."""
    sim = SimWorker(model=cfg.model.name, hardware=cfg.hardware, workdir=workdir, time_scale=10.0)
    return HttpRunner(
        sim,
        kind="sim",
        model_name=cfg.model.name,
        endpoint="completions",
        vocab_size=SIM_VOCAB,
        time_scale=10.0,
        early_stop=early_stop,
    )
