"""The simulated vLLM server's routes: vLLM's OpenAI API and ``/metrics`` over aiohttp.

Handlers parse a request (:mod:`autotune.sim.wire`), queue it on the engine driver
(:mod:`autotune.sim.driver`) and write what the driver hands its stream, step by step, in
vLLM 0.32's wire format. Nothing here touches the engine's state.
"""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import IO, Any

from aiohttp import web

from autotune.sim.clock import RealClock
from autotune.sim.driver import EngineDriver, Stream, metrics_for
from autotune.sim.engine import Engine, context_length_error
from autotune.sim.request import FINISHED
from autotune.sim.tokenizer import SyntheticTokenizer
from autotune.sim.wire import (
    DONE,
    ENGINE_DEAD,
    VLLM_VERSION,
    completion_response,
    engine_dead_event,
    error_body,
    prompt_ids,
    response_id,
    sse,
    stream_frames,
)

__all__ = ["SimServer"]


def _error(status: int, message: str, etype: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, etype, param), status=status)


class SimServer:
    def __init__(
        self,
        engine: Engine,
        *,
        served_model_name: str,
        model_path: str,
        api_key: str | None = None,
        time_scale: float = 1.0,
        seed: int = 0,
        request_log: IO[str] | None = None,
        stats_interval: float = 10.0,
    ) -> None:
        self.engine = engine
        self.model_name = served_model_name
        self.model_path = model_path
        self.api_key = api_key
        self.clock = RealClock(time_scale)
        self.tokenizer = SyntheticTokenizer(engine.model.vocab_size)
        self.metrics = metrics_for(engine, served_model_name)
        self.driver = EngineDriver(
            engine,
            self.clock,
            self.metrics,
            seed=seed,
            request_log=request_log,
            stats_interval=stats_interval,
        )

    # -- app -----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # Everything built at startup (engine, tables, imports) lives as long as the server:
        # keep it out of the collector so full collections do not pause token delivery.
        gc.collect()
        gc.freeze()
        self.driver.start()

    async def _stop(self, _app: web.Application) -> None:
        await self.driver.stop()

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # vLLM checks the key on /v1 routes only (health, metrics, version stay open)
        if (
            self.api_key
            and request.path.startswith("/v1")
            and request.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- simple endpoints ----------------------------------------------------------
    async def health(self, _r: web.Request) -> web.Response:
        if self.driver.engine_error is not None:  # vLLM 0.32 answers 503 once the engine is dead
            return web.Response(status=503)
        return web.Response(status=200)

    def fail_engine(self) -> None:
        """The fault hook (``autotune sim serve`` runs it on SIGUSR1): the simulated
        EngineCore dies while the API server stays up, as when vLLM's EngineCore process is
        killed. It logs vLLM's lines, fails every stream in flight with an error event,
        answers new requests with 500 and ``/health`` with 503."""
        self.driver.fail_engine()

    async def version(self, _r: web.Request) -> web.Response:
        return web.json_response(
            {
                "version": VLLM_VERSION,
                "simulated": True,
                "time_scale": self.clock.scale,
                "hardware": self.engine.hardware.name,
                "vocab_size": self.engine.model.vocab_size,
            }
        )

    async def models(self, _r: web.Request) -> web.Response:
        now = int(time.time())
        perm = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": now,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.model_name,
            "object": "model",
            "created": now,
            "owned_by": "vllm",
            "root": self.model_path,
            "parent": None,
            "max_model_len": self.engine.args.max_model_len,
            "permission": [perm],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_page(self, _r: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = self.metrics.CONTENT_TYPE
        return resp

    async def _json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Invalid JSON body", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object", "BadRequestError")
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            try:
                ids = self.tokenizer.encode(self.tokenizer.chat_prompt(body["messages"]))
            except (ValueError, TypeError) as exc:
                return _error(400, str(exc), "BadRequestError")
        else:
            ids = self.tokenizer.encode(str(body.get("prompt", "")))
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.engine.args.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        tokens = body.get("tokens")
        vocab = self.engine.model.vocab_size
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and 0 <= t < vocab for t in tokens
        ):
            return _error(
                400, f"tokens must be a list of integers in [0, {vocab})", "BadRequestError"
            )
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    # -- generation ----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model", self.model_name)
        if model != self.model_name:
            return _error(
                404,
                f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                "NotFoundError",
                "model",
            )
        if self.driver.engine_error is not None:
            return _error(500, ENGINE_DEAD, "EngineDeadError")
        parsed = prompt_ids(body, chat, self.tokenizer, self.engine.model.vocab_size)
        if isinstance(parsed, str):
            return _error(400, parsed, "BadRequestError")
        ids, as_ids = parsed
        mml = self.engine.args.max_model_len
        mt = body.get("max_completion_tokens") if chat else None
        mt = mt if mt is not None else body.get("max_tokens")
        if mt is not None and (not isinstance(mt, int) or mt < 1):
            return _error(400, "max_tokens must be a positive integer", "BadRequestError")
        # vLLM 0.32: a prompt that reaches max_model_len is refused; otherwise max_tokens is
        # cut to what is left (200, finish_reason "length"), it is not an error.
        err = context_length_error(mml, len(ids), at_least=not as_ids)
        if err is not None:
            return _error(400, err[0], "BadRequestError", err[1])
        max_tokens = min(mt if mt is not None else mml, mml - len(ids))
        stream = self.driver.submit(ids, max_tokens, request.headers.get("X-Request-Id"))
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, stream, chat, include_usage)
            return await self._complete(stream, chat)
        finally:  # client gone (handler cancelled, connection reset) or an error: free it
            if stream.req is None or stream.req.status != FINISHED:
                self.driver.abort(stream)

    async def _stream(
        self, request: web.Request, s: Stream, chat: bool, include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        frames = stream_frames(
            response_id(chat, s.request_id),
            chat=chat,
            created=int(time.time()),
            model=self.model_name,
        )
        token_text = self.tokenizer.token_text
        while True:
            tokens, reason = await s.queue.get()
            if reason == "error":  # the engine died: vLLM ends the stream with an error event
                await resp.write(sse(engine_dead_event()))
                await resp.write(DONE)
                await resp.write_eof()
                return resp
            for i, tid in enumerate(tokens):
                text = token_text(tid)
                if reason is not None and i == len(tokens) - 1:
                    data = frames.last(text, reason)
                else:
                    data = frames.token(text)
                if s.first_chunk < 0:  # the first message with choices: role chunk + token
                    s.first_chunk = self.clock.now()
                    data = frames.role + data
                await resp.write(data)
            if reason is not None:
                break
        if include_usage:
            await resp.write(frames.usage(len(s.prompt_ids), s.delivered))
        await resp.write(DONE)
        await resp.write_eof()
        return resp

    async def _complete(self, s: Stream, chat: bool) -> web.Response:
        out: list[int] = []
        reason: str | None = None
        while reason is None:
            tokens, reason = await s.queue.get()
            out.extend(tokens)
        if reason == "error":
            return _error(500, ENGINE_DEAD, "EngineDeadError")
        return web.json_response(
            completion_response(
                response_id(chat, s.request_id),
                chat=chat,
                created=int(time.time()),
                model=self.model_name,
                text="".join(self.tokenizer.token_text(t) for t in out),
                finish_reason=reason,
                prompt_tokens=len(s.prompt_ids),
                completion_tokens=len(out),
            )
        )
