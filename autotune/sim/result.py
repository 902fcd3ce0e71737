"""What a simulated run gives back: per-request timings, the per-step timeline of what vLLM
exports as metrics, and the headline figures in ``vllm bench serve``'s units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from autotune.sim.args import ResolvedArgs
from autotune.sim.memory import MemoryPlan
from autotune.sim.request import RequestTiming

__all__ = ["FloatArray", "IntArray", "SimResult", "Timeline"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class Timeline:
    """Per-step samples of what vLLM exports as metrics (arrays of equal length)."""

    t: FloatArray  # step end time
    running: IntArray  # vllm:num_requests_running
    waiting: IntArray  # vllm:num_requests_waiting
    kv_usage: FloatArray  # vllm:kv_cache_usage_perc (0-1)
    preemptions: IntArray  # vllm:num_preemptions_total (cumulative)
    tokens: IntArray  # vllm:iteration_tokens_total observations
    prefill_tokens: IntArray
    decode_tokens: IntArray


@dataclass
class SimResult:
    requests: list[RequestTiming]
    timeline: Timeline
    memory: MemoryPlan
    args: ResolvedArgs
    num_steps: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    end: float = 0.0  # engine clock when the replay ended (the last step's end, or the stop)
    stopped_at: float | None = None  # the ``stop`` hook ended it here (requests unfinished)

    @property
    def num_preemptions(self) -> int:
        return int(self.timeline.preemptions[-1]) if len(self.timeline.preemptions) else 0

    def summary(self) -> dict[str, float | int]:
        """Headline figures, in ``vllm bench serve``'s units (ms, per second)."""
        done = [r for r in self.requests if not r.rejected]
        out: dict[str, float | int] = {
            "completed": len(done),
            "rejected": len(self.requests) - len(done),
            "num_preemptions": self.num_preemptions,
            "num_steps": self.num_steps,
        }
        if not done:
            return out
        start = min(r.arrival for r in done)
        duration = max(r.finish for r in done) - start
        ttft = np.array([r.ttft for r in done]) * 1e3
        tpot = np.array([r.tpot for r in done if r.output_len > 1] or [0.0]) * 1e3
        out_tokens = sum(r.output_len for r in done)
        out.update(
            duration_s=duration,
            request_throughput=len(done) / duration if duration > 0 else 0.0,
            output_throughput=out_tokens / duration if duration > 0 else 0.0,
            mean_ttft_ms=float(ttft.mean()),
            median_ttft_ms=float(np.percentile(ttft, 50)),
            p99_ttft_ms=float(np.percentile(ttft, 99)),
            mean_tpot_ms=float(tpot.mean()),
            p99_tpot_ms=float(np.percentile(tpot, 99)),
        )
        return out
