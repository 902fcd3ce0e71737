"""Streaming client for OpenAI-compatible servers (vLLM or autotune's simulated one).

Timing follows vLLM's bench client (``vllm/benchmarks/lib/endpoint_request_func.py``):
the clock starts just before the POST, TTFT is taken at the first SSE message with
non-empty ``choices`` (even if its text is empty), every later such message adds one ITL
gap, E2EL ends at the last token-bearing message (not at the usage chunk or ``[DONE]``),
and the output token count comes from the usage chunk, else from the number of token
messages. Unlike vLLM's client this one never raises for a failed request: every HTTP
error, broken stream, stall and timeout becomes a record with ``success=False`` and an
error string ``"<kind>: <detail>"`` (kinds: ``http_<status>``, ``over_length``,
``not_sse``, ``bad_chunk``, ``server_error``, ``no_tokens``, ``connection``, ``stall``,
``timeout``, ``cancelled``, ``client``), so one bad request cannot abort a trial.
Cancellation still propagates: a cancelled task must stay cancelled.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from autotune.loadgen.bench_stats import RequestRecord
from autotune.loadgen.payload import (
    DEFAULT_STALL_TIMEOUT,
    Endpoint,
    RequestOptions,
    build_payload,
    endpoint_url,
)
from autotune.loadgen.spec import RequestSpec
from autotune.loadgen.sse import DONE, SSEParser

__all__ = [
    "DEFAULT_STALL_TIMEOUT",
    "Attempt",
    "Endpoint",
    "RequestOptions",
    "build_payload",
    "endpoint_url",
    "make_session",
    "run_attempt",
    "send_request",
]

# vLLM's over-length rejections: "This model's maximum context length is N tokens. ..." (API
# server) and "The decoder prompt (length N) is longer than the maximum model length of M."
# A prompt of exactly max_model_len tokens leaves no room for output: vLLM 0.32 then answers
# "max_tokens must be at least 1, got 0" (seen on real vLLM; tests/data/vllm032).
_OVER_LENGTH = re.compile(
    r"maximum context length|longer than the maximum model length"
    r"|max_tokens must be at least 1, got 0",
    re.I,
)
_BODY_LIMIT = 4096  # bytes of an error body worth reading
_MSG_LIMIT = 300  # characters of it worth keeping in a record


def make_session(max_connections: int | None = None) -> aiohttp.ClientSession:
    """One session per run. The connector limit is explicit: aiohttp's default of 100
    connections would silently cap an unbounded run (0 = unlimited, as vLLM sets it)."""
    connector = aiohttp.TCPConnector(limit=max_connections or 0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), trust_env=False
    )


class Attempt:
    """Mutable state of one request in flight (raw ``perf_counter`` times).

    It lives outside the coroutine that fills it so that a runner cancelling the request
    (drain timeout) still records what had arrived. :meth:`record` converts to engine
    seconds from ``origin``, which the runner may move (warm-ups are timed before t = 0).
    """

    def __init__(
        self,
        spec: RequestSpec,
        *,
        origin: float,
        time_scale: float = 1.0,
        scheduled_at: float | None = None,
        warmup: bool = False,
        request_id: str | None = None,
    ) -> None:
        self.spec = spec
        self.request_id = request_id if request_id is not None else spec.request_id
        self.origin = origin
        self.time_scale = time_scale
        self.scheduled_at = scheduled_at  # engine seconds; None = when it was sent
        self.ignore_eos = True  # set from the request options when sent
        self.warmup = warmup
        self.sent: float | None = None
        self.first: float | None = None
        self.last: float | None = None
        self.finished: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        self.usage_out: int | None = None
        self.usage_prompt: int | None = None
        self.status: int | None = None
        self.error: str | None = None
        self.over_length = False

    def token_chunk(self, t: float) -> None:
        if self.first is None:
            self.first = t
        elif self.last is not None:
            self.gaps.append(t - self.last)
        self.last = t
        self.chunks += 1

    def fail(self, error: str, *, over_length: bool = False) -> None:
        """Keep the first error: later ones are consequences of it."""
        if self.error is None:
            self.error = error
            self.over_length = over_length
        if self.finished is None:
            self.finished = time.perf_counter()

    def record(self) -> RequestRecord:
        k = self.time_scale
        finished = self.finished if self.finished is not None else time.perf_counter()
        sent = None if self.sent is None else (self.sent - self.origin) * k
        error = self.error or ""
        if not error and self.first is None:
            error = "no_tokens: never received a valid chunk to calculate TTFT"
        return RequestRecord(
            request_id=self.request_id,
            success=not error,
            error=error,
            http_status=self.status,
            prompt_len=self.spec.prompt_len,
            prompt_tokens=self.usage_prompt,
            output_tokens=self.usage_out if self.usage_out is not None else self.chunks,
            scheduled_at=self.scheduled_at if self.scheduled_at is not None else (sent or 0.0),
            sent_at=sent,
            first_token_at=None if self.first is None else (self.first - self.origin) * k,
            last_token_at=None if self.last is None else (self.last - self.origin) * k,
            finished_at=(finished - self.origin) * k,
            itl=[gap * k for gap in self.gaps],
            ttft=None if self.first is None or self.sent is None else (self.first - self.sent) * k,
            e2el=None if self.last is None or self.sent is None else (self.last - self.sent) * k,
            over_length=self.over_length,
            truncated=(
                not error
                and self.ignore_eos
                and (self.usage_out if self.usage_out is not None else self.chunks)
                < self.spec.output_len
            ),
            warmup=self.warmup,
        )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MSG_LIMIT else text[: _MSG_LIMIT - 3] + "..."


def _error_message(text: str) -> str:
    """The message of an OpenAI/vLLM error body (``{"message"}``, ``{"error": {...}}``,
    FastAPI's ``{"detail"}``), else the raw text."""
    try:
        body = json.loads(text)
    except ValueError:
        return _short(text)
    if isinstance(body, dict):
        inner = body.get("error")
        for candidate in (
            inner.get("message") if isinstance(inner, dict) else inner,
            body.get("message"),
            body.get("detail"),
        ):
            if candidate:
                return _short(str(candidate))
    return _short(text)


async def _read_head(resp: aiohttp.ClientResponse) -> str:
    data = b""
    while len(data) < _BODY_LIMIT:
        part = await resp.content.read(_BODY_LIMIT - len(data))
        if not part:
            break
        data += part
    return data.decode("utf-8", errors="replace")


def _on_event(attempt: Attempt, payload: str, now: float) -> bool:
    """Apply one SSE payload; True when the stream is over (``[DONE]`` or an error)."""
    if payload.strip() == DONE:
        return True
    try:
        chunk = json.loads(payload)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        attempt.fail(f"bad_chunk: SSE data is not a JSON object: {_short(payload)}")
        return True
    if "error" in chunk or chunk.get("object") == "error":  # vLLM reports engine errors inline
        attempt.fail(f"server_error: {_error_message(payload)}")
        return True
    if chunk.get("choices"):
        attempt.token_chunk(now)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            attempt.usage_out = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            attempt.usage_prompt = usage["prompt_tokens"]
    return False


async def _exchange(
    session: aiohttp.ClientSession, url: str, attempt: Attempt, options: RequestOptions
) -> None:
    try:
        body = build_payload(attempt.spec, options)
    except ValueError as exc:
        attempt.sent = time.perf_counter()
        attempt.fail(f"client: {exc}")
        return
    attempt.ignore_eos = options.ignore_eos
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    # vLLM takes X-Request-Id as the request's id: server logs and metrics line up with ours
    headers["X-Request-Id"] = attempt.request_id
    # sock_read is the stall timeout: aiohttp re-arms it on every read, headers included.
    per_request = aiohttp.ClientTimeout(
        total=None, sock_read=options.stall_timeout, sock_connect=options.stall_timeout
    )
    attempt.sent = time.perf_counter()
    async with session.post(url, json=body, headers=headers, timeout=per_request) as resp:
        attempt.status = resp.status
        if resp.status != 200:
            msg = _error_message(await _read_head(resp))
            if resp.status == 400 and _OVER_LENGTH.search(msg):
                attempt.fail(f"over_length: {msg}", over_length=True)
            else:
                attempt.fail(f"http_{resp.status}: {resp.reason or ''}: {msg}")
            return
        ctype = resp.headers.get("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            head = _short(await _read_head(resp))
            attempt.fail(f"not_sse: expected text/event-stream, got {ctype or 'none'}: {head}")
            return
        parser = SSEParser()
        async for data in resp.content.iter_any():
            now = time.perf_counter()  # one receive time for every event in this read
            for payload in parser.feed(data):
                if _on_event(attempt, payload, now):
                    if attempt.finished is None:
                        attempt.finished = now
                    return
        now = time.perf_counter()
        for payload in parser.close():
            if _on_event(attempt, payload, now):
                break
        if attempt.finished is None:
            attempt.finished = now


async def run_attempt(
    session: aiohttp.ClientSession, base_url: str, attempt: Attempt, options: RequestOptions
) -> None:
    """Send ``attempt``'s request and fill it in; raises nothing but CancelledError."""
    deadline = asyncio.timeout(options.timeout)
    try:
        async with deadline:
            await _exchange(session, endpoint_url(base_url, options.endpoint), attempt, options)
    except TimeoutError:  # aiohttp's ServerTimeoutError is one too
        if deadline.expired():
            attempt.fail(f"timeout: no complete answer within {options.timeout:g} s")
        elif attempt.status is None:
            attempt.fail(f"stall: no response from the server within {options.stall_timeout:g} s")
        else:
            attempt.fail(
                f"stall: no data from the server for {options.stall_timeout:g} s "
                f"after {attempt.chunks} token chunks"
            )
    except aiohttp.ClientPayloadError as exc:
        attempt.fail(
            f"connection: stream broken after {attempt.chunks} token chunks: {_short(str(exc))}"
        )
    except (aiohttp.ClientConnectionError, OSError) as exc:
        attempt.fail(f"connection: {type(exc).__name__}: {_short(str(exc))}")
    except Exception as exc:  # a client-side bug must cost one record, not the whole trial
        attempt.fail(f"client: {type(exc).__name__}: {_short(str(exc))}")
    finally:
        if attempt.finished is None:  # normal end is set above; this covers cancellation
            attempt.finished = time.perf_counter()


async def send_request(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    *,
    model: str,
    endpoint: Endpoint = "completions",
    api_key: str | None = None,
    timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
    time_scale: float = 1.0,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    extra_body: Mapping[str, Any] | None = None,
) -> RequestRecord:
    """Send one streaming request now and return its record (times from its own send).

    Never raises for a failed request (see the module docstring); ``time_scale`` k turns
    wall seconds into engine seconds (the server runs k times faster than wall time).
    """
    options = RequestOptions(
        model=model,
        endpoint=endpoint,
        api_key=api_key,
        timeout=timeout,
        stall_timeout=stall_timeout,
        temperature=temperature,
        ignore_eos=ignore_eos,
        extra_body=extra_body,
    )
    attempt = Attempt(spec, origin=time.perf_counter(), time_scale=time_scale)
    await run_attempt(session, base_url, attempt, options)
    return attempt.record()
