"""Per-device levels for the parallelism stage (docs/tuning.md#16-the-parallelism-stage).

When a study searches ``tensor_parallel_size``, trials of different sizes hold different
numbers of devices, and the search compares them per device: a trial of ``k`` devices at load
scale ``s`` is offered ``k * s`` times the workload's rate, and its level is reported at scale
``s`` with its throughputs divided by ``k``; the sample is looped into ``k`` copies, so the
level lasts as long as a one-device level at ``s``. The capacity lattice, the early stop, settling
and the validation phase then compare trials of every size on one axis, load per device,
with no change of their own; latencies are the server's as measured. :class:`PerDevice`
wraps the study's runner and does exactly that; everything else is the wrapped runner's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from autotune.failures import FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.sender import ProgressSnapshot
from autotune.store import WorkerUsage
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import Runner, StartInfo
from autotune.workers.devices import world_size
from autotune.workload.core import Workload
from autotune.workload.sustain import tiled

__all__ = ["PER_DEVICE_KEYS", "SERVER_DEVICES_KEY", "PerDevice", "per_device_metrics"]

# the level summary's count of the devices its per-device figures divide (absent: a study
# that does not search the parallelism, whose figures are the server's)
SERVER_DEVICES_KEY = "server_devices"

# the summary's figures that are rates of the whole server (vLLM's key names)
PER_DEVICE_KEYS = (
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "request_goodput",
    "max_output_tokens_per_s",
)


def per_device_metrics(m: LevelMetrics, devices: int) -> LevelMetrics:
    """``m`` with its throughputs per device; the summary says how many devices it ran on."""
    if devices == 1:
        return dataclasses.replace(m, summary={**m.summary, SERVER_DEVICES_KEY: 1})
    summary = {
        k: (v / devices if k in PER_DEVICE_KEYS and isinstance(v, int | float) else v)
        for k, v in m.summary.items()
    }
    summary[SERVER_DEVICES_KEY] = devices
    return dataclasses.replace(
        m,
        output_throughput=m.output_throughput / devices,
        request_throughput=m.request_throughput / devices,
        goodput=None if m.goodput is None else m.goodput / devices,
        summary=summary,
    )


class PerDevice:
    """A runner whose levels are per device: ``k`` devices (the trial's world size, from
    its engine args over the static ones) get ``k`` times the load, and report per device."""

    def __init__(self, inner: Runner, static_args: Mapping[str, Any]) -> None:
        self.inner = inner
        self.static = dict(static_args)
        self.devices = 1
        self.kind = inner.kind

    def __getattr__(self, name: str) -> Any:  # redraw, reseed, usage, ...: the inner's
        return getattr(self.inner, name)

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.devices = world_size({**self.static, **engine_args}) or 1
        return await self.inner.start(engine_args, trial_name)

    def failure(self) -> FailureMatch | None:
        return self.inner.failure()

    async def stop(self) -> None:
        await self.inner.stop()

    def usage(self) -> WorkerUsage | None:
        return self.inner.usage()

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome:
        k = self.devices
        # k copies of the sample: at k times the rate the level then lasts as long as one
        # device's does, so per-device throughputs are over the same span (a shorter level's
        # drain would weigh more and bias against the larger size)
        wl = tiled(workload, k)
        out = await self.inner.run_level(wl, scale * k, progress=progress)
        return dataclasses.replace(
            out,
            scale=scale,
            offered_rate=None if out.offered_rate is None else out.offered_rate / k,
            metrics=per_device_metrics(out.metrics, k),
        )
