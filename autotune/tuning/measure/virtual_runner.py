"""The ``sim-virtual`` runner: the engine in-process on the virtual clock, no HTTP. Its
per-request timings become the same records the HTTP client produces, so one metric
implementation scores both (the protocol: :mod:`autotune.tuning.measure.runner_protocol`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.errors import SimStartupError
from autotune.failures import FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, jitter_seed, plan_memory, replay_level, sim_engine_args
from autotune.store import WorkerUsage
from autotune.tuning.measure.outcome import EnginePeaks, LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo, offered_rate, with_diagnosis
from autotune.tuning.measure.usage import UsageMeter, sim_startup_s
from autotune.workers.devices import devices_held
from autotune.workers.vllm_command import format_command, vllm_argv
from autotune.workload.build import scale_rate
from autotune.workload.core import Workload

__all__ = ["VirtualRunner"]


class VirtualRunner:
    """``sim-virtual``: every level is one in-process simulation of the scaled workload."""

    kind = "sim-virtual"

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        *,
        model_name: str,
        static_args: Mapping[str, Any],
        seed: int,
        jitter_cv: float,
        warmup: int = 0,
        early_stop: StopRule | None = None,
        observe: StopRule | None = None,
    ) -> None:
        self.model, self.hardware, self.model_name = model, hardware, model_name
        self.static = dict(static_args)
        self.seed, self.jitter_cv = seed, jitter_cv
        self.warmup = warmup
        self.early_stop = early_stop  # None: every level replays to its end
        # the rule that watches a level replayed to its end, noting where it would stop
        # (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees")
        self.observe = observe
        self.args: EngineArgs | None = None
        self.draw = 0  # the jitter stream (0: the study's own); see redraw()
        self.meter = UsageMeter()  # what each worker costs (docs/cost.md)

    def set_early_stop(self, rule: StopRule | None) -> StopRule | None:
        """Stop the next levels by ``rule`` (:class:`~.runner_protocol.EarlyStopping`)."""
        prev, self.early_stop = self.early_stop, rule
        return prev

    def redraw(self, k: int) -> None:
        """Draw jitter stream ``k`` for the next levels, until stop(): a repeat of a level
        with fresh noise (the server's noise, docs/tuning.md#7-validation); 0 is the
        study's own stream (docs/tuning.md#2-common-random-numbers)."""
        self.draw = k

    def reseed(self, seed: int) -> bool:
        """The running worker's next levels draw the jitter of ``seed``, as a worker started
        for it would (docs/tuning.md#7-validation); False when none is running."""
        if self.args is None:
            return False
        self.seed, self.draw = seed, 0
        return True

    def split_usage(self) -> WorkerUsage | None:
        """What the running worker cost since its start or the last split (docs/cost.md)."""
        return self.meter.split() if self.meter.open else None

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        every = {**self.static, **engine_args}
        self.meter.begin(devices_held(every))
        args = sim_engine_args(engine_args, self.static)
        try:
            mem = plan_memory(self.model, self.hardware, args.resolve(self.model, self.hardware))
        except SimStartupError as exc:  # charged up to where vLLM would have failed
            self.meter.started(sim_startup_s(self.model, every, exc.failure_class))
            self.meter.end()
            raise
        self.meter.started(sim_startup_s(self.model, every))
        self.args = args
        argv = vllm_argv(
            ["vllm"],
            self.model_name,
            engine_args,
            static_args=self.static,
            host="127.0.0.1",
            port=8000,
        )
        return StartInfo(format_command(argv), argv, 0.0, mem.kv_tokens, mem.max_concurrency)

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome:
        assert self.args is not None, "start() first"
        # the replay itself is the simulator's (autotune.sim.replay_level); this side turns
        # it into the level outcome tuning scores
        level = replay_level(
            self.model,
            self.hardware,
            self.args,
            scale_rate(workload, scale),
            seed=jitter_seed(self.seed ^ (0x9E3779B9 * self.draw), scale),  # draw 0: the seed
            jitter_cv=self.jitter_cv,
            warmup=self.warmup,
            early_stop=self.early_stop,
            observe=self.observe,
        )
        metrics = LevelMetrics.from_summary(level.summary, level.stop, level.observed)
        out = LevelOutcome(
            scale,
            offered_rate(workload, scale),
            metrics,
            replay_s=level.replay_s,
            requests=level.records,
            peaks=EnginePeaks(level.peak_running, level.peak_kv_usage, level.preemptions),
        )
        self.meter.replayed(level.replay_s)
        r = level.args
        return with_diagnosis(out, level.telemetry, r.max_num_seqs, r.max_num_batched_tokens)

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        self.meter.end()
        self.args, self.draw = None, 0

    def usage(self) -> WorkerUsage | None:
        return self.meter.last
