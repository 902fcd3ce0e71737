"""HTTP contract of the simulated vLLM server (in-process, over real HTTP)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def make_server(
    time_scale: float = 20.0,
    api_key: str | None = None,
    log: io.StringIO | None = None,
    **args: Any,
) -> SimServer:
    m, hw = get_model(MODEL), get_hardware("H100-80GB")
    ea = EngineArgs(**{"max_model_len": 2048, **args})
    eng = Engine(m, hw, ea, seed=0, keep_history=False)
    return SimServer(
        eng,
        served_model_name=MODEL,
        model_path=MODEL,
        api_key=api_key,
        time_scale=time_scale,
        request_log=log,
        stats_interval=0,
    )


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    srv = make_server()
    async with TestClient(TestServer(srv.app())) as c:
        c.sim = srv  # type: ignore[attr-defined]
        yield c


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    """Raw SSE events (the text after 'data: '), checking vLLM's framing on the way."""
    body = (await resp.read()).decode()
    assert body.endswith("data: [DONE]\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


async def test_health_version_models(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/health")).status == 200
    v = await (await client.get("/version")).json()
    assert v["version"] == "0.32.0" and v["time_scale"] == 20.0
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 2048


async def test_streaming_completion_framing_and_usage(client: TestClient[Any, Any]) -> None:
    resp = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "hello world " * 20,
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0,
        },
    )
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    token_chunks = [c for c in chunks if c["choices"]]
    assert len(token_chunks) == 12
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in token_chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in token_chunks[:-1])
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12


async def test_no_usage_chunk_without_include_usage(client: TestClient[Any, Any]) -> None:
    resp = await client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 3, "stream": True},
    )
    chunks = [json.loads(e) for e in (await sse_events(resp))[:-1]]
    assert len(chunks) == 3 and all(c["choices"] for c in chunks)


async def test_token_id_prompt_and_non_streaming(client: TestClient[Any, Any]) -> None:
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(100, 150)), "max_tokens": 5}
    )
    body = await resp.json()
    assert body["usage"] == {"prompt_tokens": 50, "total_tokens": 55, "completion_tokens": 5}
    assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["text"]


async def test_chat_streaming_sends_role_then_content(client: TestClient[Any, Any]) -> None:
    resp = await client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi there"}],
            "max_completion_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [json.loads(e) for e in (await sse_events(resp))[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"]]
    assert len(content) == 4 and all(c["object"] == "chat.completion.chunk" for c in content)
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    plain = await (
        await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
    ).json()
    assert plain["choices"][0]["message"]["role"] == "assistant"
    assert plain["usage"]["completion_tokens"] == 3


async def test_length_rules_follow_real_vllm(client: TestClient[Any, Any]) -> None:
    # prompt + max_tokens beyond max_model_len: served, output cut (vLLM 0.32 does this)
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(2000)), "max_tokens": 100}
    )
    assert resp.status == 200
    body = await resp.json()
    assert body["usage"]["completion_tokens"] == 48
    assert body["choices"][0]["finish_reason"] == "length"
    # the prompt alone is too long: 400 with vLLM's text and param
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(2100)), "max_tokens": 10}
    )
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert err["param"] == "input_tokens"
    assert err["message"].startswith(
        "This model's maximum context length is 2048 tokens. "
        "However, your prompt contains 2100 input tokens"
    )
    # text prompts: vLLM tokenizes only up to max_model_len + 1
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "word " * 3000, "max_tokens": 10}
    )
    assert (
        "your prompt contains at least 2049 input tokens" in (await resp.json())["error"]["message"]
    )
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(2048)), "max_tokens": 10}
    )
    err = (await resp.json())["error"]
    assert err["param"] == "max_tokens" and err["message"].startswith(
        "max_tokens must be at least 1, got 0"
    )


async def test_unknown_model_and_bad_json(client: TestClient[Any, Any]) -> None:
    r = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status == 404
    r = await client.post("/v1/completions", data=b"{not json")
    assert r.status == 400


async def test_tokenize_round_trip(client: TestClient[Any, Any]) -> None:
    tok = await (
        await client.post("/tokenize", json={"model": MODEL, "prompt": "the quick brown fox"})
    ).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 2048
    text = await (await client.post("/detokenize", json={"tokens": tok["tokens"]})).json()
    again = await (await client.post("/tokenize", json={"prompt": text["prompt"]})).json()
    assert again["tokens"] == tok["tokens"]


async def test_api_key_required_on_v1_only() -> None:
    srv = make_server(api_key="sekrit")
    async with TestClient(TestServer(srv.app())) as c:
        assert (await c.get("/health")).status == 200
        assert (await c.get("/v1/models")).status == 401
        bad = await c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert bad.status == 401 and (await bad.json()) == {"error": "Unauthorized"}
        ok = await c.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert ok.status == 200


def metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels.get("le") and "finished_reason" not in s.labels:
                out.setdefault(s.name, s.value)
    return out


async def test_metrics_track_the_engine_and_waiting_grows_when_max_num_seqs_binds() -> None:
    srv = make_server(time_scale=5.0, max_num_seqs=2)
    async with TestClient(TestServer(srv.app())) as c:

        async def one() -> None:
            r = await c.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": [5] * 64, "max_tokens": 40, "stream": True},
            )
            await r.read()

        tasks = [asyncio.create_task(one()) for _ in range(8)]
        await asyncio.sleep(0.1)
        mid = metrics(await (await c.get("/metrics")).text())
        assert mid["vllm:num_requests_running"] == 2
        assert mid["vllm:num_requests_waiting"] >= 4
        await asyncio.gather(*tasks)
        end = metrics(await (await c.get("/metrics")).text())
        assert end["vllm:generation_tokens_total"] == 8 * 40
        assert end["vllm:num_requests_running"] == 0 and end["vllm:num_requests_waiting"] == 0
        assert end["vllm:e2e_request_latency_seconds_count"] == 8
        assert end["vllm:request_queue_time_seconds_sum"] > 0


async def test_request_log_matches_what_the_client_sees() -> None:
    buf = io.StringIO()
    scale = 10.0
    srv = make_server(time_scale=scale, log=buf)
    async with TestClient(TestServer(srv.app())) as c:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r = await c.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": [7] * 500, "max_tokens": 20, "stream": True},
        )
        first = None
        async for _line in r.content:
            if first is None:
                first = loop.time()
        rec = json.loads(buf.getvalue().splitlines()[0])
    assert first is not None
    assert rec["output_tokens"] == 20 and rec["prompt_tokens"] == 500
    assert len(rec["token_times"]) == 20 and rec["time_scale"] == scale
    server_ttft = rec["first_token"] - rec["arrival"]
    client_ttft = (first - t0) * scale  # engine seconds
    assert client_ttft == pytest.approx(server_ttft, abs=0.02 * scale)


async def test_client_disconnect_aborts_and_frees_the_request() -> None:
    srv = make_server(time_scale=1.0)
    async with TestClient(TestServer(srv.app())) as c:
        r = await c.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": [3] * 32, "max_tokens": 1000, "stream": True},
        )
        await r.content.readline()
        r.close()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not srv.engine.sched.has_work:
                break
        assert not srv.engine.sched.has_work
        # every block is free again (vLLM's null block is never handed out)
        assert srv.engine.sched.kv.num_free == srv.engine.memory.num_blocks - 1
