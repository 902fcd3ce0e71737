"""Prompts of the requested length on any tokenizer (docs/loadgen.md#4-exact-prompt-lengths).

A stand-in server with a character-level tokenizer (nothing like autotune's word list, about
3-5 tokens per detokenized id) checks the calibration; the simulated server checks the whole
path through ``autotune bench``."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autotune.config import WorkloadConfig
from autotune.loadgen import make_session, probe_server
from autotune.loadgen.bench import run_bench
from autotune.loadgen.bench_stats import length_warning, summarize
from autotune.loadgen.tokens import clear_cache, prepare_for_server, server_tokens
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import MIN_TOKEN_ID
from autotune.workload.token_space import (
    TokenSpace,
    chat_tolerance,
    load_token_space,
    next_content_len,
    ordinary_ids,
)

TEMPLATE = "<|user|>\n{}\n<|assistant|>\n"


class CharServer:
    """``/tokenize`` counts characters (+ BOS for completions, the template for chat);
    ``/detokenize`` spells id ``i`` as a pseudo-word of 1-6 letters. Counts every call."""

    def __init__(self) -> None:
        self.calls = 0

    @staticmethod
    def ids(text: str) -> list[int]:
        return [20 + ord(c) % 400 for c in text]

    async def tokenize(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        if "messages" in body:
            content = body["messages"][0]["content"]
            ids = [1, *self.ids(TEMPLATE.format(content))]
        else:
            bos = [1] if body.get("add_special_tokens", True) else []
            ids = bos + self.ids(body["prompt"])
        return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": 8192})

    async def detokenize(self, request: web.Request) -> web.Response:
        self.calls += 1
        letters = "etaoinshrdlucmfwyp"
        words = []
        for t in (await request.json())["tokens"]:
            n = 1 + t % 6
            words.append("".join(letters[(t * 7 + k) % len(letters)] for k in range(n)))
        return web.json_response({"prompt": " ".join(words)})

    def app(self) -> web.Application:
        app = web.Application()

        async def models(_r: web.Request) -> web.Response:
            card = {"id": "foreign", "root": "/no/such/folder", "max_model_len": 8192}
            return web.json_response({"object": "list", "data": [card]})

        async def version(_r: web.Request) -> web.Response:
            return web.json_response({"version": "0.32.0"})

        app.router.add_get("/v1/models", models)
        app.router.add_get("/version", version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        return app


@pytest.fixture
async def char_server() -> AsyncIterator[tuple[CharServer, str]]:
    clear_cache()
    srv = CharServer()
    async with TestServer(srv.app()) as ts:
        yield srv, str(ts.make_url("")).rstrip("/")
    clear_cache()


def workload(lengths: list[int], **kw: Any) -> Workload:
    reqs = [WorkloadRequest(n, 16, request_id=f"r{i}", **kw) for i, n in enumerate(lengths)]
    return Workload(reqs, "test")


# -- pure logic ----------------------------------------------------------------------------


def test_ordinary_ids_leave_out_added_tokens_and_low_ids() -> None:
    vocab = {f"p{i}": i for i in range(1900)}
    tok = {
        "model": {"type": "BPE", "vocab": vocab},
        "added_tokens": [
            {"id": 0, "content": "<unk>", "special": True},
            {"id": 1900, "content": "<|user|>", "special": True},
            {"id": 1901, "content": "<tool>", "special": False},
            {"id": 100, "content": "<mask>", "special": True},
        ],
    }
    ids = ordinary_ids(tok)
    assert ids is not None
    assert ids[0] == MIN_TOKEN_ID and ids[-1] == 1899 and 100 not in ids
    assert len(ids) == 1900 - MIN_TOKEN_ID - 1
    # Unigram: a list of [piece, score], the index is the id
    uni = ordinary_ids({"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 50}})
    assert uni is not None and uni.tolist() == list(range(MIN_TOKEN_ID, 50))
    assert ordinary_ids({"model": {"type": "BPE"}}) is None


def test_token_space_from_a_model_folder(tmp_path: Path) -> None:
    vocab = {f"p{i}": i for i in range(300)}
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": vocab}, "added_tokens": [{"id": 299, "special": True}]})
    )
    space = load_token_space(tmp_path)
    assert space is not None and space.largest == 298 and len(space) == 298 - MIN_TOKEN_ID + 1
    assert load_token_space(tmp_path / "missing") is None


def test_mapping_keeps_equal_ids_equal_and_stays_in_the_space() -> None:
    space = TokenSpace([5, 9, 40, 41, 77], "test")
    a = space.map([16, 17, 31999, 16])
    assert a[0] == a[3] and set(a) <= {5, 9, 40, 41, 77}
    ident = TokenSpace.full(32000, "sim")
    assert ident.map([16, 500, 31999]) == (16, 500, 31999)


def test_chat_tolerance_is_one_percent_or_two_tokens() -> None:
    assert chat_tolerance(50) == 2 and chat_tolerance(200) == 2 and chat_tolerance(1000) == 10


def test_next_content_len_brackets_the_target() -> None:
    assert next_content_len(100, 10, [], 3.0) == 30
    # 30 ids gave 104 tokens, 28 gave 95: the next try lies strictly between
    k = next_content_len(100, 10, [(30, 104), (28, 95)], 3.0)
    assert k == 29
    assert next_content_len(100, 10, [(30, 104), (29, 95)], 3.0) is None  # nothing left


# -- against a server -----------------------------------------------------------------------


async def test_chat_prompts_measure_within_tolerance_on_a_foreign_tokenizer(
    char_server: tuple[CharServer, str],
) -> None:
    srv, base = char_server
    lengths = [40, 64, 200, 1000, 3000]
    async with make_session() as http:
        info = await probe_server(base)
        tokens = await server_tokens(http, info)
        assert tokens.space is not None and "probe text" in tokens.space.source
        wl = await prepare_for_server(workload(lengths), tokens, endpoint="chat", vocab_size=32000)
        for r, want in zip(wl.requests, lengths, strict=True):
            assert r.prompt_text is not None and r.prompt_len == want
            got = await tokens.count(r.prompt_text, "chat")
            assert got is not None and abs(got - want) <= chat_tolerance(want), (want, got)
        calls = srv.calls
        # cached per server and model: a second level (new session) asks nothing again
        again = await server_tokens(http, info)
        wl2 = await prepare_for_server(workload(lengths), again, endpoint="chat", vocab_size=32000)
        assert [r.prompt_text for r in wl2.requests] == [r.prompt_text for r in wl.requests]
        assert srv.calls == calls


async def test_completions_send_exact_token_ids_from_the_servers_vocabulary(
    char_server: tuple[CharServer, str],
) -> None:
    _, base = char_server
    async with make_session() as http:
        tokens = await server_tokens(http, await probe_server(base))
        wl = await prepare_for_server(
            workload([10, 700]), tokens, endpoint="completions", vocab_size=32000
        )
    assert tokens.space is not None
    allowed = set(tokens.space.ids.tolist())
    for r, n in zip(wl.requests, [10, 700], strict=True):
        assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == n
        assert set(r.prompt_token_ids) <= allowed and 1 not in allowed  # no BOS


async def test_given_text_is_counted_by_the_server(char_server: tuple[CharServer, str]) -> None:
    _, base = char_server
    wl = Workload([WorkloadRequest(3, 8, prompt_text="hello world", request_id="t")], "t")
    async with make_session() as http:
        tokens = await server_tokens(http, await probe_server(base))
        got = await prepare_for_server(wl, tokens, endpoint="completions", vocab_size=32000)
    assert got.requests[0].prompt_text == "hello world"
    assert got.requests[0].prompt_len == 1 + len("hello world")  # BOS + characters


def test_length_warning_only_beyond_two_percent() -> None:
    from autotune.loadgen.bench_stats import RequestRecord

    def recs(measured: int) -> list[RequestRecord]:
        return [
            RequestRecord(
                f"r{i}",
                success=True,
                prompt_len=1000,
                prompt_tokens=measured,
                output_tokens=2,
                ttft=0.1,
                e2el=0.2,
                sent_at=0.0,
                finished_at=0.2,
            )
            for i in range(4)
        ]

    assert length_warning(summarize(recs(1015), 1.0)) is None
    line = length_warning(summarize(recs(3900), 1.0))
    assert line is not None and "\n" not in line and "290.0% longer" in line


# -- the simulator through autotune bench ---------------------------------------------------


async def test_bench_chat_on_the_simulator_sends_the_requested_lengths() -> None:
    clear_cache()
    eng = Engine(
        get_model("meta-llama/Llama-3.1-8B-Instruct"),
        get_hardware("H100-80GB"),
        EngineArgs(max_model_len=4096),
        keep_history=False,
    )
    srv = SimServer(
        eng, served_model_name="m", model_path="m", time_scale=20.0, request_log=io.StringIO()
    )
    wl = WorkloadConfig(
        source="random",
        num_prompts=12,
        input_len=300,
        output_len=8,
        range_ratio=0.5,
        arrival="all-at-once",
        endpoint="chat",
    )
    async with TestServer(srv.app()) as ts:
        out = await run_bench(str(ts.make_url("")), wl, endpoint="chat")
    recs = [r for r in out.result.records if not r.warmup]
    assert len(recs) == 12 and all(r.success for r in recs)
    for r in recs:
        assert r.prompt_tokens is not None
        assert abs(r.prompt_tokens - r.prompt_len) <= chat_tolerance(r.prompt_len)
    assert abs(out.result.summary["prompt_len_deviation"]) <= 0.01
