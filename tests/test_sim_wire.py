"""autotune.sim.wire: the simulated server's OpenAI wire format, pure functions on tiny
inputs (no server, no aiohttp)."""

from __future__ import annotations

import json
from typing import Any

from autotune.sim.tokenizer import SyntheticTokenizer
from autotune.sim.wire import (
    DONE,
    ENGINE_DEAD,
    completion_response,
    engine_dead_event,
    error_body,
    prompt_ids,
    response_id,
    sse,
    stream_frames,
    usage,
)

VOCAB = 1000
TOK = SyntheticTokenizer(VOCAB)


def _event(frame: bytes) -> Any:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    return json.loads(frame[len(b"data: ") : -2])


def test_error_body_is_vllms_shape() -> None:
    assert error_body(400, "bad", "BadRequestError") == {
        "error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert error_body(404, "no", "NotFoundError", "model")["error"]["param"] == "model"
    assert engine_dead_event() == {
        "error": {"message": ENGINE_DEAD, "type": "EngineDeadError", "code": 500}
    }


def test_prompt_ids_of_text_ids_a_batch_of_one_and_chat() -> None:
    assert prompt_ids({"prompt": "hello world"}, False, TOK, VOCAB) == (
        TOK.encode("hello world"),
        False,
    )
    assert prompt_ids({"prompt": [1, 2, 3]}, False, TOK, VOCAB) == ([1, 2, 3], True)
    assert prompt_ids({"prompt": [[4, 5]]}, False, TOK, VOCAB) == ([4, 5], True)
    assert prompt_ids({"prompt": ["hi"]}, False, TOK, VOCAB) == (TOK.encode("hi"), False)
    msgs = [{"role": "user", "content": "hi"}]
    assert prompt_ids({"messages": msgs}, True, TOK, VOCAB) == (
        TOK.encode(TOK.chat_prompt(msgs)),
        False,
    )


def test_prompt_ids_errors() -> None:
    assert prompt_ids({"prompt": [1, VOCAB]}, False, TOK, VOCAB) == (
        f"Token id {VOCAB} is out of vocabulary"
    )
    assert prompt_ids({"prompt": []}, False, TOK, VOCAB) == (
        "prompt must be a string or a non-empty list of token ids"
    )
    assert prompt_ids({}, True, TOK, VOCAB) == "messages must be a non-empty list"


def test_stream_frames_splice_equals_a_whole_chunk() -> None:
    f = stream_frames(response_id(False, "r1"), chat=False, created=7, model="m")
    whole = {
        "id": "cmpl-r1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": 'a "b"\n',
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }
    assert f.token('a "b"\n') == sse(whole)
    assert f.role == b""
    last = _event(f.last("z", "length"))
    assert last["choices"][0]["finish_reason"] == "length" and "usage" not in last
    tail = _event(f.usage(3, 2))
    assert tail["choices"] == [] and tail["usage"] == usage(3, 2)
    assert usage(3, 2) == {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    assert DONE == b"data: [DONE]\n\n"


def test_chat_frames_carry_the_role_chunk_and_deltas() -> None:
    f = stream_frames(response_id(True, "r2"), chat=True, created=1, model="m")
    role = _event(f.role)
    assert role["id"] == "chatcmpl-r2" and role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert _event(f.token("x"))["choices"][0]["delta"] == {"content": "x"}


def test_completion_response_chat_and_text() -> None:
    chat = completion_response(
        "chatcmpl-a",
        chat=True,
        created=5,
        model="m",
        text="hi",
        finish_reason="length",
        prompt_tokens=4,
        completion_tokens=1,
    )
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert chat["usage"] == usage(4, 1)
    text = completion_response(
        "cmpl-a",
        chat=False,
        created=5,
        model="m",
        text="hi",
        finish_reason="length",
        prompt_tokens=4,
        completion_tokens=1,
    )
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "hi"
    assert text["choices"][0]["stop_reason"] is None
