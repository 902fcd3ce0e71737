"""The simulator against what real vLLM (CPU 0.32) produced, from saved captures.

``tests/data/vllm032/`` holds the real server's ``/metrics`` page after load, its startup
log, the logs of three failing launches, its answers around ``max_model_len`` and
``meta.json`` (the settings behind each). ``tests/real_vllm`` recaptures them
(``AUTOTUNE_RECAPTURE=1``); these tests need no vLLM. The simulator runs the same configs
for model ``autotune/tiny-llama`` on hardware ``test-4GB``, with the CPU backend's block size
of 128 given explicitly (the simulator defaults to the GPU's 16). Texts may differ where vLLM
words CPU and GPU differently; classes and parsed numbers may not. Known differences are
strict xfails whose reason says what real vLLM does.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from autotune.errors import SimStartupError
from autotune.failures import FailureClass, classify_log
from autotune.loadgen import make_session, send_request
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.memory import plan_memory
from autotune.sim.routes import SimServer
from autotune.workers import parse_cache_config_info, parse_startup_facts
from autotune.workload.core import WorkloadRequest

DATA = Path(__file__).parent / "data" / "vllm032"
MODEL, HARDWARE = "autotune/tiny-llama", "test-4GB"
CPU_BLOCK_SIZE = 128


@cache
def meta() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "meta.json").read_text(encoding="utf-8"))
    return data


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def sim_args(entry: dict[str, Any]) -> EngineArgs:
    """The simulator's engine args for a captured launch (engine plus static args)."""
    return EngineArgs(**entry["engine_args"], **entry["static_args"], block_size=CPU_BLOCK_SIZE)


def sim_engine(entry: dict[str, Any]) -> Engine:
    return Engine(get_model(MODEL), get_hardware(HARDWARE), sim_args(entry), keep_history=False)


def sim_server() -> SimServer:
    served = meta()["model"]["tiny-llama"]["served_model_name"]
    return SimServer(
        sim_engine(meta()["server"]["shared"]),
        served_model_name=served,
        model_path=MODEL,
        stats_interval=0,
    )


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def shape(fam: Metric) -> set[tuple[str, tuple[str, ...]]]:
    """Sample names (suffixes) with their label names, bucket bounds aside."""
    return {
        (s.name.removeprefix(fam.name), tuple(sorted(set(s.labels) - {"le"}))) for s in fam.samples
    }


def buckets(fam: Metric) -> list[float]:
    return sorted({float(s.labels["le"]) for s in fam.samples if "le" in s.labels})


def sim_failure(entry: dict[str, Any]) -> SimStartupError:
    m, hw = get_model(MODEL), get_hardware(HARDWARE)
    with pytest.raises(SimStartupError) as caught:
        plan_memory(m, hw, sim_args(entry).resolve(m, hw))
    return caught.value


# -- /metrics ---------------------------------------------------------------------------


def test_model_profile_is_the_real_test_model() -> None:
    m = get_model(MODEL)
    model = meta()["model"]["tiny-llama"]
    assert m.max_position_embeddings == model["max_position_embeddings"]
    assert m.page_bytes_per_layer(CPU_BLOCK_SIZE) * m.num_layers == (
        model["kv_bytes_per_token"] * CPU_BLOCK_SIZE
    )


def test_sim_exposes_every_real_vllm_family_with_its_type_labels_and_buckets() -> None:
    real = families(read("metrics_after_load.txt"))
    sim = families(sim_server().metrics.render().decode())
    assert len(real) >= 39  # 39 families, plus the _created gauges of counters/histograms
    missing = sorted(set(real) - set(sim))
    assert not missing, f"vllm: families real vLLM exposes and the simulator does not: {missing}"
    for name, fam in real.items():
        assert sim[name].type == fam.type, name
        assert shape(sim[name]) == shape(fam), name
        assert buckets(sim[name]) == buckets(fam), name
        assert sim[name].documentation == fam.documentation, name


def test_sim_cache_config_info_matches_real() -> None:
    real = parse_cache_config_info(read("metrics_after_load.txt"))
    sim = parse_cache_config_info(sim_server().metrics.render().decode())
    assert real is not None and sim is not None
    assert set(sim) == set(real)
    for key in (
        "num_gpu_blocks",
        "block_size",
        "kv_cache_size_tokens",
        "kv_cache_memory_bytes",
        "kv_cache_max_concurrency",
        "gpu_memory_utilization",
        "enable_prefix_caching",
    ):
        assert sim[key] == real[key], key
    server = meta()["server"]["shared"]
    assert int(real["num_gpu_blocks"]) == server["num_gpu_blocks"]
    assert int(real["kv_cache_size_tokens"]) == server["kv_cache_tokens"]


def test_startup_kv_facts_match() -> None:
    """The KV line: ``CPU KV cache size: 131,072 tokens, Maximum concurrency for 1,024 tokens
    per request: 128.00x`` (the simulator says GPU); both parse to the same numbers."""
    real = parse_startup_facts(read("startup.log").splitlines())
    sim = parse_startup_facts(sim_engine(meta()["server"]["shared"]).memory.log_lines)
    assert real == sim
    assert real.kv_cache_tokens == meta()["server"]["shared"]["kv_cache_tokens"]


# -- startup failures -------------------------------------------------------------------

FAILURES = ("mnbt_lt_maxlen", "maxlen_gt_model", "kv_too_small")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def real_failure_lines(name: str) -> list[str]:
    return read(f"failure_{name}.log").splitlines()


@pytest.mark.parametrize("name", FAILURES)
def test_failure_class_matches(name: str) -> None:
    entry = meta()["failures"][name]
    real = classify_log(real_failure_lines(name))
    assert real is not None and str(real.failure_class) == entry["failure_class"]
    sim = sim_failure(entry)
    assert sim.failure_class is real.failure_class
    matched = classify_log(sim.log_lines)
    assert matched is not None and matched.failure_class is real.failure_class


@pytest.mark.parametrize("name", ["mnbt_lt_maxlen", "maxlen_gt_model"])
def test_config_error_text_matches(name: str) -> None:
    """pydantic's ``Value error, <message> [type=...]`` line, word for word."""
    real = classify_log(real_failure_lines(name))
    sim = classify_log(sim_failure(meta()["failures"][name]).log_lines)
    assert real is not None and sim is not None
    assert real.line.split(" [type=")[0] == sim.line.split(" [type=")[0]


def _kv_numbers(line: str) -> dict[str, Any]:
    m = re.search(
        r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger "
        r"than the available KV cache memory \(([\d.]+) GiB\)",
        line,
    )
    assert m is not None, line
    return {"max_model_len": int(m.group(1)), "needed_gib": m.group(2), "available_gib": m.group(3)}


def test_kv_too_small_numbers_match() -> None:
    real = classify_log(real_failure_lines("kv_too_small"))
    sim = classify_log(sim_failure(meta()["failures"]["kv_too_small"]).log_lines)
    assert real is not None and sim is not None
    assert _kv_numbers(real.line) == _kv_numbers(sim.line)
    # the CPU backend adds "(which also controls CPU memory on the CPU backend)"
    cpu_aside = " (which also controls CPU memory on the CPU backend)"
    assert _NUMBER.sub(
        "N", real.line.split("ValueError: ")[1].replace(cpu_aside, "")
    ) == _NUMBER.sub("N", sim.line.split("ValueError: ")[1])


def test_kv_too_small_estimate_matches() -> None:
    entry = meta()["failures"]["kv_too_small"]
    real = classify_log(real_failure_lines("kv_too_small"))
    sim = classify_log(sim_failure(entry).log_lines)
    assert real is not None and sim is not None
    assert real.estimated_max_model_len == entry["estimated_max_model_len"] == 384
    assert sim.estimated_max_model_len == real.estimated_max_model_len


def test_kv_for_exactly_one_request_fails_like_vllm() -> None:
    m = get_model(MODEL)
    per_block = m.page_bytes_per_layer(CPU_BLOCK_SIZE) * m.num_layers
    entry = json.loads(json.dumps(meta()["server"]["shared"]))
    entry["static_args"]["kv_cache_memory_bytes"] = 1024 // CPU_BLOCK_SIZE * per_block
    err = sim_failure(entry)
    assert err.failure_class is FailureClass.KV_TOO_SMALL


# -- requests around max_model_len ------------------------------------------------------

LENGTH_CASES = (
    "text_prompt_over",
    "token_prompt_over",
    "token_prompt_equal",
    "token_prompt_plus_output_over",
    "chat_over",
)


@cache
def real_cases() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(read("length_cases.json"))
    return data


def case_body(name: str, model: str) -> dict[str, Any]:
    """The request the real server got for ``name`` (tests/real_vllm rebuilds it so)."""
    case = real_cases()[name]
    body: dict[str, Any] = dict(case["request"])
    body["model"] = model
    long_text = " that" * 1300  # over 1024 tokens for vLLM's BPE and the synthetic tokenizer
    if case["prompt_token_ids"] is not None:
        body["prompt"] = [100] * case["prompt_token_ids"]
    elif case["path"].endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": long_text}]
    else:
        body["prompt"] = long_text
    return body


@pytest.fixture
async def sim_client() -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(sim_server().app())) as client:
        yield client


async def sim_answer(client: TestClient[Any, Any], name: str) -> tuple[int, dict[str, Any]]:
    model = meta()["model"]["tiny-llama"]["served_model_name"]
    resp = await client.post(real_cases()[name]["path"], json=case_body(name, model))
    text = await resp.text()
    if resp.status == 200 and text.startswith("data: "):
        return 200, {}
    return resp.status, json.loads(text)


@pytest.mark.parametrize("name", LENGTH_CASES)
async def test_length_case_status_matches(sim_client: TestClient[Any, Any], name: str) -> None:
    status, _ = await sim_answer(sim_client, name)
    assert status == real_cases()[name]["status"]


@pytest.mark.parametrize("name", [n for n in LENGTH_CASES if n != "token_prompt_plus_output_over"])
async def test_400_body_shape_matches(sim_client: TestClient[Any, Any], name: str) -> None:
    """``{"error": {"message", "type", "param", "code"}}``, BadRequestError, code 400."""
    status, body = await sim_answer(sim_client, name)
    real = real_cases()[name]["body"]
    assert status == 400
    assert set(body) == set(real) == {"error"}
    assert set(body["error"]) == set(real["error"])
    assert body["error"]["type"] == real["error"]["type"] == "BadRequestError"
    assert body["error"]["code"] == real["error"]["code"] == 400


def _normalized(error: dict[str, Any]) -> tuple[str, Any]:
    """Message with numbers (tokenizers count text differently) and vLLM's 'at least' (it
    stops tokenizing text at max_model_len + 1) taken out, and the param."""
    return _NUMBER.sub("N", error["message"].replace("at least ", "")), error["param"]


# Real texts are in tests/data/vllm032/length_cases.json: "This model's maximum context
# length is 1024 tokens. However, your prompt contains 1224 input tokens, which exceeds this
# limit even without any output tokens. Please reduce the length of the input prompt.
# (parameter=input_tokens, value=1224)" (param "input_tokens"), and for a prompt of exactly
# max_model_len "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
# (param "max_tokens").
@pytest.mark.parametrize("name", [n for n in LENGTH_CASES if n != "token_prompt_plus_output_over"])
async def test_400_message_and_param_match(sim_client: TestClient[Any, Any], name: str) -> None:
    _, body = await sim_answer(sim_client, name)
    assert _normalized(body["error"]) == _normalized(real_cases()[name]["body"]["error"])


# -- our load generator on vLLM's real 400 bodies ---------------------------------------


@pytest.fixture
async def replay() -> AsyncIterator[TestServer]:
    """Answers every POST with the captured real answer of the case named by the request id
    (our client sends the spec's ``request_id`` as ``X-Request-Id``)."""

    async def answer(request: web.Request) -> web.Response:
        case = real_cases()[request.headers["X-Request-Id"]]
        return web.json_response(case["body"], status=case["status"])

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    app.router.add_post("/v1/chat/completions", answer)
    server = TestServer(app)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@pytest.mark.parametrize("name", [n for n in LENGTH_CASES if n != "token_prompt_plus_output_over"])
async def test_loadgen_records_real_rejections_as_over_length(
    replay: TestServer, name: str
) -> None:
    case = real_cases()[name]
    n = case["prompt_token_ids"] or 1300
    spec = WorkloadRequest(n, 16, prompt_text=" that" * n, request_id=name)
    endpoint: Literal["completions", "chat"] = (
        "chat" if case["path"].endswith("/chat/completions") else "completions"
    )
    async with make_session() as http:
        rec = await send_request(
            http,
            str(replay.make_url("")).rstrip("/"),
            spec,
            model="m",
            endpoint=endpoint,
            extra_body=None,
            stall_timeout=10,
            timeout=10,
        )
    assert rec.http_status == 400 and not rec.success
    assert rec.over_length, rec.error
