"""A small misbehaving OpenAI-compatible server on 127.0.0.1 (random port), one per test.

The prompt text picks how it answers a request ("ok", "500", "overlen", "reset", "hang",
"stall", ...), so one run can mix failure modes; ``Spec`` is a request spec for
``autotune.loadgen``. Use the ``fake`` fixture by importing it into the test module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

__all__ = ["ITL", "OVERLEN", "SLACK", "TTFT", "Fake", "Spec", "fake", "sse"]

TTFT = 0.05  # the fake server's sleep before the first token chunk
ITL = 0.02  # and between token chunks
SLACK = 0.04  # scheduling noise allowed on top of those sleeps (busy CI machines)
OVERLEN = (
    "This model's maximum context length is 128 tokens. However, you requested 300 tokens "
    "(200 in the messages, 100 in the completion). Please reduce the length of the messages "
    "or completion."
)


@dataclass(frozen=True)
class Spec:
    request_id: str
    prompt_text: str | None = "ok"
    prompt_len: int = 8
    output_len: int = 5
    prompt_token_ids: tuple[int, ...] | None = None
    arrival: float | None = None


def sse(obj: Any) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


@dataclass
class Fake:
    url: str = ""
    in_flight: int = 0
    peak: int = 0
    handled: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def _tokens(self, request: web.Request, n: int, chat: bool, usage: bool) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(TTFT)
        if chat:  # vLLM's first chat chunk carries the role and empty content
            await resp.write(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        for i in range(n - 1 if chat else n):
            if i or chat:
                await asyncio.sleep(ITL)
            piece = {"delta": {"content": "x"}} if chat else {"text": "x"}
            await resp.write(sse({"choices": [{"index": 0, **piece}]}))
        if usage:
            u = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            await resp.write(sse({"choices": [], "usage": u}))
        await resp.write(sse("[DONE]"))
        return resp

    async def handle(self, request: web.Request) -> Any:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization"))
        chat = "messages" in body
        mode = body["messages"][0]["content"] if chat else body["prompt"]
        mode = mode if isinstance(mode, str) else "ok"
        n = body.get("max_tokens", 5)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if mode in ("ok", "nousage"):
                return await self._tokens(request, n, chat, usage=mode == "ok")
            if mode == "500":
                return web.Response(status=500, text="engine died")
            if mode == "overlen":
                err = {"object": "error", "message": OVERLEN, "type": "BadRequestError"}
                return web.json_response({**err, "param": None, "code": 400}, status=400)
            if mode == "bad400":
                return web.json_response({"error": {"message": "bad temperature"}}, status=400)
            if mode == "notsse":
                return web.json_response({"choices": [{"text": "all at once"}]})
            if mode == "hang":  # no response at all until released
                await asyncio.wait_for(self.release.wait(), 10)
                return web.Response(text="late")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(sse({"choices": [{"index": 0, "text": "x"}]}))
            await resp.write(sse({"choices": [{"index": 0, "text": "x"}]}))
            if mode == "reset":  # drop the TCP connection mid-stream
                assert request.transport is not None
                request.transport.abort()
                return resp
            if mode == "inline_error":
                await resp.write(sse({"error": {"message": "EngineCore died"}}))
            elif mode == "stall":
                await asyncio.wait_for(self.release.wait(), 10)
            return resp
        finally:
            self.in_flight -= 1
            self.handled += 1

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": "tiny", "object": "model", "max_model_len": 128}]
        return web.json_response({"object": "list", "data": data})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0", "time_scale": 10.0})


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    state = Fake()
    app = web.Application()
    app.router.add_post("/v1/completions", state.handle)
    app.router.add_post("/v1/chat/completions", state.handle)
    app.router.add_get("/v1/models", state.models)
    app.router.add_get("/version", state.version)
    # handler_cancellation: like vLLM, abandon a request when its client goes away.
    server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
    await server.start_server()
    state.url = f"http://127.0.0.1:{server.port}"
    yield state
    state.release.set()
    await server.close()
