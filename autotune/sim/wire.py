"""vLLM 0.32's OpenAI wire format, as the simulated server speaks it: pure functions, no I/O.

What a request body asks for (the prompt's token ids) and every body the server answers with:
SSE ``data: {...}`` chunks, a usage chunk when ``stream_options.include_usage`` is set,
``data: [DONE]``; whole completion responses; errors as
``{"error": {"message", "type", "param", "code"}}``. The HTTP handlers
(:mod:`autotune.sim.routes`) only move these bytes and dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autotune.sim.tokenizer import SyntheticTokenizer

__all__ = [
    "DONE",
    "ENGINE_DEAD",
    "VLLM_VERSION",
    "StreamFrames",
    "completion_response",
    "engine_dead_event",
    "error_body",
    "prompt_ids",
    "response_id",
    "sse",
    "stream_frames",
    "usage",
]

VLLM_VERSION = "0.32.0"
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
DONE = b"data: [DONE]\n\n"


def error_body(status: int, message: str, etype: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body for an HTTP ``status``."""
    return {"error": {"message": message, "type": etype, "param": param, "code": status}}


def engine_dead_event() -> dict[str, Any]:
    """The error event vLLM ends a stream with when its engine died."""
    return {"error": {"message": ENGINE_DEAD, "type": "EngineDeadError", "code": 500}}


def prompt_ids(
    body: dict[str, Any], chat: bool, tokenizer: SyntheticTokenizer, vocab_size: int
) -> tuple[list[int], bool] | str:
    """The prompt's token ids and whether they came as ids (not text), or an error."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return "messages must be a non-empty list"
        try:
            return tokenizer.encode(tokenizer.chat_prompt(msgs)), False
        except (ValueError, TypeError) as exc:
            return f"invalid messages: {exc}"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), False
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            return f"Token id {bad} is out of vocabulary"
        return list(prompt), True
    return "prompt must be a string or a non-empty list of token ids"


def response_id(chat: bool, request_id: str) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + request_id


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _choice(chat: bool, text: str, finish_reason: str | None) -> dict[str, Any]:
    if chat:
        return {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }


@dataclass(frozen=True)
class StreamFrames:
    """The SSE frames of one streamed response (:func:`stream_frames` builds it)."""

    rid: str
    chat: bool
    created: int
    model: str
    head: bytes  # a mid-stream frame up to its token's JSON string ...
    tail: bytes  # ... and after it
    role: bytes  # the chat role chunk, sent with the first token (b"" for completions)

    def chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:  # as real vLLM 0.32: only the usage chunk has the key
            c["usage"] = usage
        return c

    def token(self, text: str) -> bytes:
        """A mid-stream frame: the cached frame with ``text`` spliced in."""
        return self.head + json.dumps(text).encode() + self.tail

    def last(self, text: str, finish_reason: str) -> bytes:
        """The frame of a stream's last token, with its finish reason."""
        return sse(self.chunk([_choice(self.chat, text, finish_reason)]))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The usage chunk (``stream_options.include_usage``): no choices."""
        return sse(self.chunk([], usage(prompt_tokens, completion_tokens)))


def stream_frames(rid: str, *, chat: bool, created: int, model: str) -> StreamFrames:
    """The frames of one stream. Mid-stream chunks differ only in their text: the frame is
    serialized once and each token's JSON string spliced into it (byte-identical to
    ``json.dumps`` of the whole chunk)."""
    mark = "\x00tok\x00"
    base = StreamFrames(rid, chat, created, model, b"", b"", b"")
    head, tail = sse(base.chunk([_choice(chat, mark, None)])).split(json.dumps(mark).encode())
    # vLLM 0.32 sends the chat role chunk with the first token, after prefill, in the
    # same read (tests/data/captures/chat_vs_completions_stream_timing.txt): a client
    # timing TTFT at the first chunk with choices then measures prefill, as it should.
    role_choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    role = sse(base.chunk([role_choice])) if chat else b""
    return StreamFrames(rid, chat, created, model, head, tail, role)


def completion_response(
    rid: str,
    *,
    chat: bool,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion."""
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
