"""``autotune bench``: the seed guide's baseline load test against any OpenAI-compatible
server (vLLM or autotune's simulated one), reported like ``vllm bench serve``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.config import WorkloadConfig
from autotune.loadgen.payload import Endpoint
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.runner import LoadResult, ProgressSnapshot, run_load
from autotune.workload.build import build_workload, prepare_prompts
from autotune.workload.core import Workload

__all__ = ["BenchOutcome", "format_result", "parse_goodput", "run_bench"]

_GOODPUT_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class BenchOutcome:
    server: ServerInfo
    workload: Workload
    result: LoadResult

    def to_json(self, detailed: bool = False) -> dict[str, Any]:
        """``vllm bench serve``'s result keys plus autotune's extras."""
        out = dict(self.result.summary)
        out.update(
            model_id=self.server.model_id, server_version=self.server.version,
            time_scale=self.result.time_scale, workload_source=self.workload.source,
            workload_fingerprint=self.workload.fingerprint(),
            workload_profile=self.workload.profile().to_dict(),
        )
        if detailed:
            out["requests"] = [vars(r) | {"tpot": r.tpot} for r in self.result.records]
        return out


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in _GOODPUT_KEYS or not value:
            raise ValueError(f"--goodput takes KEY:MS with KEY in {', '.join(_GOODPUT_KEYS)}; "
                             f"got {item!r}")
        ms = float(value)
        if not ms > 0:
            raise ValueError(f"--goodput {key} must be > 0 ms, got {value}")
        out[key] = ms
    return out


async def run_bench(
    base_url: str,
    workload: WorkloadConfig,
    *,
    model: str | None = None,
    endpoint: Endpoint = "completions",
    api_key: str | None = None,
    max_concurrency: int | None = None,
    duration: float | None = None,
    goodput: dict[str, float] | None = None,
    progress: Callable[[ProgressSnapshot], None] | None = None,
) -> BenchOutcome:
    info = await probe_server(base_url, api_key)
    vocab = info.vocab_size or 32000
    wl = build_workload(workload, vocab_size=vocab)
    # Token ids only where the target is known to take them with a known vocabulary (our
    # simulator); real vLLM gets text and its usage chunk gives the true counts.
    wl = prepare_prompts(wl, token_ids=endpoint == "completions" and info.vocab_size is not None,
                         vocab_size=vocab)
    concurrency = max_concurrency or wl.closed_loop_concurrency
    result = await run_load(
        info.base_url, wl.requests, model=model or info.model_id, endpoint=endpoint,
        api_key=api_key, max_concurrency=concurrency, warmup=workload.warmup,
        duration=duration, time_scale=info.time_scale, progress=progress,
        goodput_slos=goodput)
    return BenchOutcome(info, wl, result)


def _f(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.2f}" if isinstance(x, float) else str(x)


def format_result(s: dict[str, Any]) -> str:
    """The result block ``vllm bench serve`` prints, plus failures by kind."""
    rows: list[str] = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, key: str) -> None:
        rows.append(f"{label:<40}{_f(s.get(key)):<10}")

    row("Successful requests:", "completed")
    row("Failed requests:", "failed")
    row("Benchmark duration (s):", "duration")
    row("Total input tokens:", "total_input_tokens")
    row("Total generated tokens:", "total_output_tokens")
    row("Request throughput (req/s):", "request_throughput")
    if s.get("request_goodput") is not None:
        row("Request goodput (req/s):", "request_goodput")
    row("Output token throughput (tok/s):", "output_throughput")
    row("Total Token throughput (tok/s):", "total_token_throughput")
    for title, key, name in (("Time to First Token", "ttft", "TTFT"),
                             ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
                             ("Inter-token Latency", "itl", "ITL"),
                             ("End-to-end Latency", "e2el", "E2EL")):
        rows.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {name} (ms):", f"mean_{key}_ms")
        row(f"Median {name} (ms):", f"median_{key}_ms")
        row(f"P99 {name} (ms):", f"p99_{key}_ms")
    errors = s.get("errors_by_kind") or {}
    if errors or s.get("over_length_rejections"):
        rows.append("{s:{c}^{n}}".format(s="Failures", n=50, c="-"))
        for kind, count in sorted(errors.items()):
            rows.append(f"{kind + ':':<40}{count:<10}")
    if s.get("time_scale", 1.0) != 1.0:
        rows.append(f"{'Server time scale (x wall):':<40}{_f(s.get('time_scale')):<10}")
    rows.append("=" * 50)
    return "\n".join(rows)
