"""The simulated vLLM server: vLLM's OpenAI API and ``/metrics`` over the simulated engine.

One asyncio task runs the engine on a :class:`~autotune.sim.clock.RealClock`: it takes the
requests that arrived, runs a step, sleeps until the step's end (engine time / time scale) and
then hands every request its new tokens. HTTP handlers only queue requests and stream what
they are handed, so the engine sees arrivals between steps exactly as vLLM's engine core does.

Wire formats follow vLLM 0.32: SSE ``data: {...}`` chunks, a usage chunk when
``stream_options.include_usage`` is set, ``data: [DONE]``; errors as
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import web

from autotune.sim.clock import RealClock
from autotune.sim.engine import Engine, context_length_error
from autotune.sim.metrics import VllmMetrics
from autotune.sim.request import FINISHED, Req, SimRequest
from autotune.sim.tokenizer import SyntheticTokenizer

__all__ = ["VLLM_VERSION", "SimServer"]

log = logging.getLogger(__name__)
VLLM_VERSION = "0.32.0"
_ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass
class _Stream:
    """One HTTP request's view of its engine request."""

    request_id: str
    arrival: float
    prompt_ids: list[int]
    max_tokens: int
    rng: random.Random
    queue: asyncio.Queue[tuple[list[int], str | None]] = field(default_factory=asyncio.Queue)
    req: Req | None = None
    delivered: int = 0
    scheduled: float = -1.0
    first_token: float = -1.0
    first_chunk: float = -1.0  # engine time the handler wrote its first chunk with choices
    last_token: float = -1.0
    token_times: list[float] = field(default_factory=list)


def _error(status: int, message: str, etype: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": param, "code": status}}
    return web.json_response(body, status=status)


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
        self.seed = seed
        self.request_log = request_log
        self.stats_interval = stats_interval
        args = engine.args
        mem = engine.memory
        self.tokenizer = SyntheticTokenizer(engine.model.vocab_size)
        self.metrics = VllmMetrics(
            served_model_name,
            args.max_model_len,
            {
                "block_size": str(args.block_size),
                "num_gpu_blocks": str(mem.num_blocks),
                "gpu_memory_utilization": str(args.gpu_memory_utilization),
                "kv_cache_size_tokens": str(mem.kv_tokens),
                "kv_cache_max_concurrency": str(float(mem.max_concurrency)),
                "enable_prefix_caching": str(args.enable_prefix_caching),
                "kv_cache_memory_bytes": str(args.kv_cache_memory_bytes),
            },
        )
        self._pending: list[_Stream] = []
        self._aborts: list[_Stream] = []
        self._live: dict[Req, _Stream] = {}
        self._wake = asyncio.Event()
        self._n = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._window = [0, 0]  # prompt / generation tokens since the last stats line
        self.engine_error: BaseException | None = None

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
        self._loop_task = asyncio.create_task(self._engine_loop(), name="sim-engine")
        if self.stats_interval > 0:
            self._stats_task = asyncio.create_task(self._stats_loop(), name="sim-stats")

    async def _stop(self, _app: web.Application) -> None:
        for t in (self._loop_task, self._stats_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

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
        if self.engine_error is not None:  # vLLM 0.32 answers 503 once the engine is dead
            return web.Response(status=503)
        return web.Response(status=200)

    def fail_engine(self) -> None:
        """The fault hook (``autotune sim serve`` runs it on SIGUSR1): the simulated
        EngineCore dies while the API server stays up, as when vLLM's EngineCore process is
        killed. It logs vLLM's lines, fails every stream in flight with an error event,
        answers new requests with 500 and ``/health`` with 503."""
        if self.engine_error is not None:
            return
        self.engine_error = RuntimeError(_ENGINE_DEAD)
        log.error(
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client. "
            "(simulated fault)"
        )
        log.error("AsyncLLM output_handler failed.")
        log.error("vllm.v1.engine.exceptions.EngineDeadError: %s", _ENGINE_DEAD)
        if self._loop_task is not None:
            self._loop_task.cancel()
        for s in [*self._live.values(), *self._pending]:
            s.queue.put_nowait(([], "error"))
        self._live.clear()
        self._pending.clear()

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

    def _prompt_ids(self, body: dict[str, Any], chat: bool) -> tuple[list[int], bool] | str:
        """The prompt's token ids and whether they came as ids (not text), or an error."""
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return "messages must be a non-empty list"
            try:
                return self.tokenizer.encode(self.tokenizer.chat_prompt(msgs)), False
            except (ValueError, TypeError) as exc:
                return f"invalid messages: {exc}"
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt), False
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            vocab = self.engine.model.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                return f"Token id {bad} is out of vocabulary"
            return list(prompt), True
        return "prompt must be a string or a non-empty list of token ids"

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
        if self.engine_error is not None:
            return _error(500, _ENGINE_DEAD, "EngineDeadError")
        parsed = self._prompt_ids(body, chat)
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
        stream = self._submit(ids, max_tokens, request.headers.get("X-Request-Id"))
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, stream, chat, include_usage)
            return await self._complete(stream, chat)
        finally:  # client gone (handler cancelled, connection reset) or an error: free it
            if stream.req is None or stream.req.status != FINISHED:
                self._abort(stream)

    def _submit(self, ids: list[int], max_tokens: int, request_id: str | None) -> _Stream:
        self._n += 1
        s = _Stream(
            request_id=request_id or uuid.uuid4().hex,
            arrival=self.clock.now(),
            prompt_ids=ids,
            max_tokens=max_tokens,
            rng=random.Random(self.seed * 1_000_003 + self._n),
        )
        self._pending.append(s)
        self._wake.set()
        return s

    def _abort(self, s: _Stream) -> None:
        self._aborts.append(s)
        self._wake.set()

    def _token_text(self, tid: int) -> str:
        return self.tokenizer.token_text(tid)

    async def _stream(
        self, request: web.Request, s: _Stream, chat: bool, include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        rid = ("chatcmpl-" if chat else "cmpl-") + s.request_id

        def frame_of(payload: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(frame_of(payload))

        def chunk(choices: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
            c: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.model_name,
                "choices": choices,
            }
            if usage is not None:  # as real vLLM 0.32: only the usage chunk has the key
                c["usage"] = usage
            return c

        def choice(text: str, fr: str | None) -> dict[str, Any]:
            if chat:
                return {
                    "index": 0,
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": fr,
                }
            return {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": fr,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }

        # Mid-stream chunks differ only in their text: serialize the frame once and splice
        # each token's JSON string into it (byte-identical to json.dumps of the whole chunk).
        mark = "\x00tok\x00"
        frame = b"data: " + json.dumps(chunk([choice(mark, None)])).encode() + b"\n\n"
        head, tail = frame.split(json.dumps(mark).encode())
        # vLLM 0.32 sends the chat role chunk with the first token, after prefill, in the
        # same read (tests/data/captures/chat_vs_completions_stream_timing.txt): a client
        # timing TTFT at the first chunk with choices then measures prefill, as it should.
        role = (
            frame_of(
                chunk(
                    [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            )
            if chat
            else b""
        )
        while True:
            tokens, reason = await s.queue.get()
            if reason == "error":  # the engine died: vLLM ends the stream with an error event
                err = {"message": _ENGINE_DEAD, "type": "EngineDeadError", "code": 500}
                await send({"error": err})
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            for i, tid in enumerate(tokens):
                text = self._token_text(tid)
                if reason is not None and i == len(tokens) - 1:
                    data = frame_of(chunk([choice(text, reason)]))
                else:
                    data = head + json.dumps(text).encode() + tail
                if s.first_chunk < 0:  # the first message with choices: role chunk + token
                    s.first_chunk = self.clock.now()
                    data = role + data
                await resp.write(data)
            if reason is not None:
                break
        if include_usage:
            n = s.delivered
            await send(
                chunk(
                    [],
                    {
                        "prompt_tokens": len(s.prompt_ids),
                        "total_tokens": len(s.prompt_ids) + n,
                        "completion_tokens": n,
                    },
                )
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _complete(self, s: _Stream, chat: bool) -> web.Response:
        out: list[int] = []
        reason: str | None = None
        while reason is None:
            tokens, reason = await s.queue.get()
            out.extend(tokens)
        if reason == "error":
            return _error(500, _ENGINE_DEAD, "EngineDeadError")
        text = "".join(self._token_text(t) for t in out)
        usage = {
            "prompt_tokens": len(s.prompt_ids),
            "total_tokens": len(s.prompt_ids) + len(out),
            "completion_tokens": len(out),
        }
        rid = ("chatcmpl-" if chat else "cmpl-") + s.request_id
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    # -- the engine task -----------------------------------------------------------
    async def _engine_loop(self) -> None:
        eng = self.engine
        sched = eng.sched
        caching = eng.args.enable_prefix_caching
        try:
            while True:
                if not sched.has_work and not self._pending and not self._aborts:
                    self._wake.clear()
                    await self._wake.wait()
                for s in self._aborts:
                    if s.req is not None:
                        sched.abort(s.req, eng.step_idx)
                        self._live.pop(s.req, None)
                    elif s in self._pending:
                        self._pending.remove(s)
                self._aborts.clear()
                for s in self._pending:
                    sr = SimRequest(
                        len(s.prompt_ids),
                        s.max_tokens,
                        s.arrival,
                        prompt_token_ids=s.prompt_ids if caching else None,
                    )
                    r = eng.add(sr, user=s)
                    assert isinstance(r, Req)  # lengths were checked in the handler
                    s.req = r
                    self._live[r] = s
                self._pending.clear()
                if not sched.has_work:
                    continue
                now = self.clock.now()
                pre0, q0, h0 = sched.num_preemptions, sched.prefix_queries, sched.prefix_hits
                end, st = eng.step(now)
                step: dict[str, Any] = {
                    "iteration_tokens": st.num_tokens,
                    "generation_tokens": st.num_sampled,
                    "running": len(sched.running),
                    "waiting": len(sched.waiting),
                    "kv_usage": sched.kv.usage,
                    "preemptions": sched.num_preemptions - pre0,
                    "prefix_queries": sched.prefix_queries - q0,
                    "prefix_hits": sched.prefix_hits - h0,
                }
                await self.clock.sleep_until(end)
                # vLLM counts a request's whole prompt, cached tokens included, in the step
                # that emits its first token (tests/data/captures/prompt_tokens_cached.txt)
                prompt_tokens = self._deliver(now, end)
                self.metrics.observe_step(prompt_tokens=prompt_tokens, **step)
                self._window[0] += prompt_tokens
                self._window[1] += st.num_sampled
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine bug: fail every stream, /health turns 500
            self.engine_error = exc
            log.exception("simulated engine died")
            for s in self._live.values():
                s.queue.put_nowait(([], "error"))
            raise

    def _deliver(self, step_start: float, end: float) -> int:
        """Hand every stream its new tokens; returns the prompt tokens (whole prompts) of
        the requests whose first token this step emitted."""
        sched = self.engine.sched
        nxt = self.engine.step_idx
        vocab = self.engine.model.vocab_size
        gaps: list[float] = []
        live = [
            (r, s)
            for r in [*sched.running, *sched.finished]
            if (s := self._live.get(r)) is not None
        ]
        # Every token of a step carries the same time; hand first tokens out first. Handlers
        # wake in queue order, so a new stream would otherwise wait behind every running
        # stream's write, inflating the TTFT a client measures at high concurrency.
        live.sort(key=lambda rs: rs[1].first_token >= 0)
        first_prompts = 0
        for r, s in live:
            if s.scheduled < 0 and r.t_sched >= 0:
                s.scheduled = step_start
            n = r.o0 + (nxt - r.s0) if r.dec else r.output
            new = n - s.delivered
            if new <= 0:
                continue
            if s.first_token < 0:
                s.first_token = end
                first_prompts += len(s.prompt_ids)
            else:
                gaps.append(end - s.last_token)
            s.last_token = end
            s.token_times.append(end)
            s.delivered = n
            done = r.status == FINISHED
            s.queue.put_nowait(
                ([s.rng.randrange(vocab) for _ in range(new)], "length" if done else None)
            )
            if done:
                self._finished(r, s, end)
        if gaps:
            self.metrics.observe_itl(gaps)
        return first_prompts

    def _finished(self, r: Req, s: _Stream, end: float) -> None:
        del self._live[r]
        self.metrics.observe_finished(
            finished_reason="length",
            prompt_tokens=len(s.prompt_ids),
            generation_tokens=s.delivered,
            max_tokens=s.max_tokens,
            n=1,
            arrival=s.arrival,
            scheduled=s.scheduled,
            first_token=s.first_token,
            finish=end,
            num_preemptions=r.preemptions,
            prefill_computed_tokens=len(s.prompt_ids) - r.cached,
            cached_prompt_tokens=r.cached,
        )
        if self.request_log is not None:
            self.request_log.write(
                json.dumps(
                    {
                        "request_id": s.request_id,
                        "arrival": s.arrival,
                        "scheduled": s.scheduled,
                        "first_token": s.first_token,
                        # None when the handler had not written it yet (one-token outputs)
                        "first_chunk": s.first_chunk if s.first_chunk >= 0 else None,
                        "finish": end,
                        "prompt_tokens": len(s.prompt_ids),
                        "output_tokens": s.delivered,
                        "preemptions": r.preemptions,
                        "cached_tokens": r.cached,
                        "token_times": s.token_times,
                        "time_scale": self.clock.scale,
                    }
                )
                + "\n"
            )
            self.request_log.flush()

    async def _stats_loop(self) -> None:
        """vLLM's periodic stats line (every 10 s on 0.32), in wall seconds."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.stats_interval)
            now = time.monotonic()
            dt = max(now - last, 1e-9)
            last = now
            sched = self.engine.sched
            p, g = self._window
            self._window = [0, 0]
            hit = 100.0 * sched.prefix_hits / sched.prefix_queries if sched.prefix_queries else 0.0
            log.info(
                "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput:"
                " %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: "
                "%.1f%%, Prefix cache hit rate: %.1f%%",
                p / dt,
                g / dt,
                len(sched.running),
                len(sched.waiting),
                100 * sched.kv.usage,
                hit,
            )
