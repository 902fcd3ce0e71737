"""``autotune bench``: the seed guide's baseline load test against any OpenAI-compatible
server (vLLM or autotune's simulated one), reported like ``vllm bench serve``
(docs/method.md#2-baseline-before-any-change)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from autotune.config import WorkloadConfig
from autotune.errors import AutotuneError, ServiceError
from autotune.loadgen.bench_stats import error_kind
from autotune.loadgen.client import make_session
from autotune.loadgen.client_limit import ClientLimit, check
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.payload import Endpoint
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.runner import LoadResult, run_load
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.workload.build import build_workload
from autotune.workload.core import Workload
from autotune.workload.text import DEFAULT_VOCAB_SIZE

__all__ = ["BenchOutcome", "format_result", "parse_goodput", "run_bench"]

_GOODPUT_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class BenchOutcome:
    server: ServerInfo
    workload: Workload
    result: LoadResult

    def to_json(self, detailed: bool = False) -> dict[str, Any]:
        """``vllm bench serve``'s result keys plus autotune's extras (an early stop, should
        one end the run, in its stored shape)."""
        out = dict(self.result.summary)
        if self.result.early_stop is not None:
            out.update(self.result.early_stop.stored())
        if (limit := self.client_limit) is not None:
            out.update(limit.stored())
        out.update(
            model_id=self.server.model_id,
            server_version=self.server.version,
            time_scale=self.result.time_scale,
            workload_source=self.workload.source,
            workload_fingerprint=self.workload.fingerprint(),
            workload_profile=self.workload.profile().to_dict(),
        )
        if detailed:
            out["requests"] = [asdict(r) | {"tpot": r.tpot} for r in self.result.records]
        return out

    @property
    def client_limit(self) -> ClientLimit | None:
        """The bound the client passed when it could not drive the load (None: it could),
        as a study's level reads it (docs/loadgen.md#5-client-limited-levels)."""
        return check(self.result.summary)

    def client_warning(self) -> str | None:
        """One warning line when the client could not drive the load, else None."""
        limit = self.client_limit
        if limit is None:
            return None
        return (
            f"warning: {limit.text}: this host could not drive the load, so these figures "
            "are the client's, not the server's"
        )

    def failure(self) -> AutotuneError | None:
        """The error to exit with when no request succeeded (None otherwise): one line with
        the most common failure and an example of it. Unreachable servers are ServiceError."""
        s = self.result.summary
        failed = [r for r in self.result.records if not r.warmup and not r.success]
        if s.get("completed", 0) > 0 or not failed:
            return None
        kinds = Counter(error_kind(r.error) for r in failed)
        kind, count = kinds.most_common(1)[0]
        example = next(r.error for r in failed if error_kind(r.error) == kind)
        line = (
            f"all {len(failed)} requests failed ({count} {kind}"
            + (f", {len(failed) - count} other" if count < len(failed) else "")
            + f"); first: {example}"
        )
        return ServiceError(line) if set(kinds) == {"connection"} else AutotuneError(line)


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in _GOODPUT_KEYS or not value:
            raise ValueError(
                f"--goodput takes KEY:MS with KEY in {', '.join(_GOODPUT_KEYS)}; got {item!r}"
            )
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
    model_dir: str | None = None,
) -> BenchOutcome:
    """Build the workload, fit its prompts to the server and replay it. ``model_dir``: a
    local model folder whose ``tokenizer.json`` names the ordinary token ids, when the
    server's own ``/v1/models`` root is not a folder on this machine."""
    info = await probe_server(base_url, api_key)
    vocab = info.vocab_size or DEFAULT_VOCAB_SIZE
    wl = build_workload(workload, vocab_size=vocab)
    # Prompts of the requested lengths on this server's tokenizer: token ids for completions,
    # chat text built with its /detokenize and /tokenize (docs/loadgen.md#4-exact-prompt-lengths)
    async with make_session() as session:
        tokens = await server_tokens(
            session, info, model=model, api_key=api_key, model_dir=model_dir
        )
        sent = await prepare_for_server(wl, tokens, endpoint=endpoint, vocab_size=vocab)
    concurrency = max_concurrency or wl.closed_loop_concurrency
    result = await run_load(
        info.base_url,
        sent.requests,
        LoadOptions(
            model=model or info.model_id,
            endpoint=endpoint,
            api_key=api_key,
            max_concurrency=concurrency,
            warmup=workload.warmup,
            duration=duration,
            time_scale=info.time_scale,
            goodput_slos=goodput,
        ),
        progress=progress,
    )
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
    for title, key, name in (
        ("Time to First Token", "ttft", "TTFT"),
        ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
        ("Inter-token Latency", "itl", "ITL"),
        ("End-to-end Latency", "e2el", "E2EL"),
    ):
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
