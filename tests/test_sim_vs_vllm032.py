"""Two small differences between the simulated server and real vLLM 0.32, held to captures.

- ``vllm:prompt_tokens_total`` counts every prompt token, prefix-cache hits included
  (``tests/data/captures/prompt_tokens_cached.txt``).
- The chat role chunk comes with the first token, after prefill, so a client that times TTFT at
  the first message with ``choices`` (vLLM's bench client, docs/loadgen.md#11-per-request-timings)
  measures prefill on ``/v1/chat/completions`` as on ``/v1/completions``
  (``tests/data/captures/chat_vs_completions_stream_timing.txt``).
"""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from autotune.loadgen import make_session, send_request
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer
from autotune.workload.core import WorkloadRequest

CAPTURES = Path(__file__).parent / "data" / "captures"
TINY = "autotune/tiny-llama"


def server(model: str, hardware: str, log: io.StringIO | None = None, **args: Any) -> SimServer:
    eng = Engine(get_model(model), get_hardware(hardware), EngineArgs(**args), keep_history=False)
    return SimServer(
        eng, served_model_name="m", model_path=model, request_log=log, stats_interval=0
    )


def captured_deltas() -> dict[tuple[str, str], float]:
    """``(sample name, source label or "")`` -> delta, from the capture's metric lines."""
    out = {}
    line_re = re.compile(r"^(vllm:\w+)\{([^}]*)\} (\S+)$")
    for line in (CAPTURES / "prompt_tokens_cached.txt").read_text().splitlines():
        if m := line_re.match(line):
            source = re.search(r'source="(\w+)"', m.group(2))
            out[(m.group(1), source.group(1) if source else "")] = float(m.group(3))
    return out


def page_values(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("source", ""))] = s.value
    return out


async def test_prompt_tokens_total_counts_cached_tokens_as_vllm_does() -> None:
    want = captured_deltas()
    assert want[("vllm:prompt_tokens_total", "")] == 640  # the capture's own statement
    # the capture's server: CPU block size 128, prefix caching on (vLLM's default)
    srv = server(TINY, "test-4GB", max_model_len=1024, block_size=128)
    ids = [16 + (7 * i) % 1900 for i in range(320)]
    async with TestClient(TestServer(srv.app())) as c:
        before = page_values(await (await c.get("/metrics")).text())
        for _ in range(2):
            r = await c.post("/v1/completions", json={"model": "m", "prompt": ids, "max_tokens": 1})
            assert r.status == 200 and (await r.json())["usage"]["prompt_tokens"] == 320
        after = page_values(await (await c.get("/metrics")).text())
    assert len(want) == 10 and want.keys() <= after.keys()
    for key, value in want.items():
        assert after[key] - before.get(key, 0.0) == value, key


async def _ttfts(srv: SimServer, log: io.StringIO, chat: bool, n: int) -> list[dict[str, Any]]:
    """Send ``n`` distinct long prompts one after the other; the client's TTFT next to the
    server's log record of each (engine seconds)."""
    out = []
    async with TestServer(srv.app()) as ts, make_session() as http:
        base = str(ts.make_url(""))
        for i in range(n):
            kind = "chat" if chat else "cmpl"
            ids = tuple(100 + (i * 131 + 17 * j) % 30000 for j in range(3000))
            # chat takes text: the server's /detokenize of the same ids (its own vocabulary)
            spec = WorkloadRequest(3000, 8, prompt_token_ids=ids, request_id=f"{kind}-{i}")
            if chat:
                async with aiohttp.ClientSession(base) as s:
                    r = await s.post("/detokenize", json={"tokens": list(ids)})
                    text = (await r.json())["prompt"]
                spec = WorkloadRequest(3000, 8, prompt_text=text, request_id=f"{kind}-{i}")
            rec = await send_request(
                http, base, spec, model="m", endpoint="chat" if chat else "completions"
            )
            assert rec.success, rec.error
            out.append({"client": rec.ttft})
        logged = [json.loads(line) for line in log.getvalue().splitlines()]
    for entry, row in zip(out, logged[-n:], strict=True):
        entry.update(row)
    return out


async def test_chat_ttft_includes_prefill_on_the_simulator() -> None:
    """Engine-time figures from the server's own request log, so host noise cannot decide:
    the first chunk with ``choices`` leaves after prefill for chat as for completions."""
    results = {}
    for chat in (False, True):
        log = io.StringIO()
        srv = server("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB", log, max_model_len=4096)
        results[chat] = await _ttfts(srv, log, chat, 5)
    first = {
        chat: statistics.median(r["first_chunk"] - r["arrival"] for r in rows)
        for chat, rows in results.items()
    }
    prefill = statistics.median(r["first_token"] - r["arrival"] for r in results[False])
    assert prefill > 0.1  # 3000 prompt tokens of an 8B model: a prefill worth measuring
    assert abs(first[True] - first[False]) <= 0.1 * first[False], first
    assert first[True] >= 0.9 * prefill
    for r in results[True]:
        # the client cannot see the first chunk before the server wrote it (same clock rate)
        assert r["client"] >= 0.999 * (r["first_chunk"] - r["arrival"])
        assert r["prompt_tokens"] >= 3000  # the chat template adds its tokens
