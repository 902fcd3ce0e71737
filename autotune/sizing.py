"""How much memory and time a study's workload needs, estimated before ``create`` commits.

A load level keeps every request of the workload in memory several times over (the requests,
the engine's per-request state and timeline, the per-token timings the metrics need; for an
HTTP worker also each prompt's text or token ids), so a study's peak memory grows linearly
with ``workload.num_prompts``, and so does the time of each level. Rather than a fixed
per-request constant, which would be wrong for long outputs or slow arrival rates, the
estimate runs one level of a small sample of the same workload (the first
:data:`SAMPLE` prompts, built from the same config) on the in-process simulator, measures
its time and its traced peak allocation, and scales both to the full size.

:data:`RSS_FACTOR` turns traced Python allocations into resident memory (allocator arenas
and fragmentation); it was measured with ``benchmarks/workload_size.py`` at 100,000 prompts,
which also checks that the estimate is within 2x of the measured memory and time.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from dataclasses import dataclass

from autotune.config import StudyConfig
from autotune.errors import SimStartupError
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.search.plan import baseline_engine_args
from autotune.workload.build import build_workload, prepare_prompts

__all__ = [
    "LIMIT_BYTES",
    "RSS_FACTOR",
    "SAMPLE",
    "SizeEstimate",
    "estimate",
    "resident_bytes",
]

LIMIT_BYTES = 1.5e9  # the default ceiling on a study's estimated peak memory (1.5 GB)
SAMPLE = 1000  # prompts simulated to estimate the rest; workloads this small are not sized
RSS_FACTOR = 1.3  # resident memory per traced byte (benchmarks/workload_size.py)


@dataclass(frozen=True)
class SizeEstimate:
    """Estimated peak resident memory of the controller (bytes) and wall seconds per load
    level at ``num_prompts``; ``create_levels`` is how many level-sized simulations
    ``create`` itself runs: the baseline's capacity probe (slo-capacity mode, up to
    ``strategy.capacity_levels``) and the peak-concurrency estimate (unless
    ``workload.peak_concurrency`` is given)."""

    num_prompts: int
    sample: int
    peak_bytes: float
    level_s: float
    create_levels: int

    @property
    def create_s(self) -> float:
        return self.level_s * self.create_levels

    def describe(self) -> str:
        what = (
            f"{self.num_prompts:,} prompts need about {self.peak_bytes / 1e9:.1f} GB of memory "
            f"and {_duration(self.level_s)} per load level"
        )
        if self.create_levels:
            what += f" (create alone: up to {_duration(self.create_s)})"
        return what


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def resident_bytes() -> float:
    """This process's resident memory now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


async def _sample_level(
    cfg: StudyConfig, model: ModelProfile, hw: HardwareProfile, k: int
) -> tuple[float, float] | None:
    """(wall seconds, engine seconds) of one level of the first ``k`` prompts, or None if
    the simulator cannot start vLLM's defaults for this model and GPU."""
    wl = build_workload(
        cfg.workload.model_copy(update={"num_prompts": k}), vocab_size=model.vocab_size
    )
    if cfg.worker.kind != "sim-virtual":
        # an HTTP worker's level also holds every prompt's token ids or text
        wl_http = prepare_prompts(
            wl,
            token_ids=cfg.workload.endpoint == "completions" and cfg.worker.kind == "sim",
            vocab_size=model.vocab_size,
        )
        del wl_http
    longest = int(wl.profile().total_len.max)
    runner = VirtualRunner(
        model, hw, model_name=cfg.model.name, static_args={}, seed=cfg.seed, jitter_cv=0.0
    )
    try:
        await runner.start(
            baseline_engine_args(model, hw, min(longest + 1, model.max_position_embeddings)),
            "size-estimate",
        )
    except SimStartupError:
        return None
    t0 = time.perf_counter()
    out = await runner.run_level(wl, 1.0)
    wall = time.perf_counter() - t0
    await runner.stop()
    return wall, out.metrics.duration_s


def estimate(
    cfg: StudyConfig, model: ModelProfile, hw: HardwareProfile, *, sample: int = SAMPLE
) -> SizeEstimate | None:
    """The estimate for ``cfg``'s workload, or None when it has at most ``sample`` prompts
    (or the simulator cannot run vLLM's defaults for it: ``create`` says why)."""
    n = cfg.workload.num_prompts
    if n <= sample:
        return None
    base = resident_bytes()
    timed = asyncio.run(_sample_level(cfg, model, hw, sample))
    if timed is None:
        return None
    wall, engine_s = timed
    gc.collect()
    tracemalloc.start()
    try:
        asyncio.run(_sample_level(cfg, model, hw, sample))
        traced = float(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    scale = n / sample
    level_s = wall * scale
    if cfg.worker.kind == "sim":  # the server runs the engine at worker.time_scale
        level_s = max(level_s, engine_s * scale / cfg.worker.time_scale)
    elif cfg.worker.kind == "vllm":  # real time on the GPU the profile describes
        level_s = max(level_s, engine_s * scale)
    create_levels = (
        0
        if cfg.workload.peak_concurrency
        else 1 + (cfg.strategy.capacity_levels if cfg.mode == "slo-capacity" else 0)
    )
    return SizeEstimate(
        num_prompts=n,
        sample=sample,
        peak_bytes=base + RSS_FACTOR * traced * scale,
        level_s=level_s,
        create_levels=create_levels,
    )
