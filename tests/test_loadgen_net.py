"""autotune.loadgen client, runner and probe against small misbehaving aiohttp servers.

One fake server per test on 127.0.0.1 (random port). The prompt text picks how it answers
a request ("ok", "500", "overlen", "reset", ...), so one run can mix failure modes.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import pytest
from support.fake_server import ITL, SLACK, TTFT, Fake, Spec

from autotune.errors import ConfigError, ServiceError
from autotune.loadgen import (
    LoadOptions,
    ProgressSnapshot,
    RequestSpec,
    make_session,
    probe_server,
    run_load,
    send_request,
)


async def one(fake: Fake, spec: Spec, **kw: Any) -> Any:
    async with make_session() as session:
        return await send_request(session, fake.url, spec, model="tiny", **kw)


async def test_correct_stream_timing_usage_and_payload(fake: Fake) -> None:
    spec = Spec("a", prompt_text=None, prompt_token_ids=(1, 2, 3), prompt_len=3, output_len=5)
    r = await one(fake, spec, api_key="sekret", temperature=0.5)
    assert r.success and r.error == "" and r.http_status == 200
    assert TTFT <= r.ttft < TTFT + SLACK
    assert len(r.itl) == 4 and all(ITL * 0.9 <= g < ITL + SLACK for g in r.itl)
    assert r.e2el == pytest.approx(r.ttft + sum(r.itl))
    assert r.output_tokens == 5 and r.prompt_tokens == 7 and r.prompt_len == 3
    assert r.sent_at is not None and r.finished_at >= r.last_token_at >= r.first_token_at > 0
    body = fake.bodies[0]
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 5 and body["model"] == "tiny"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0.5
    assert fake.auth == ["Bearer sekret"]


async def test_chat_endpoint_and_chunk_count_fallback(fake: Fake) -> None:
    r = await one(fake, Spec("c", prompt_text="nousage", output_len=4), endpoint="chat")
    assert r.success and r.output_tokens == 4  # no usage chunk: count token chunks
    assert r.prompt_tokens is None and len(r.itl) == 3
    assert fake.bodies[0]["messages"] == [{"role": "user", "content": "nousage"}]
    assert fake.bodies[0]["max_completion_tokens"] == 4
    r = await one(fake, Spec("d", prompt_text=None, prompt_token_ids=(1,)), endpoint="chat")
    assert not r.success and r.error.startswith("client: ")


async def test_time_scale_turns_wall_into_engine_seconds(fake: Fake) -> None:
    r = await one(fake, Spec("a"), time_scale=10.0)
    assert 10 * TTFT <= r.ttft < 10 * (TTFT + SLACK)
    assert all(g >= 10 * ITL * 0.9 for g in r.itl)


@pytest.mark.parametrize(
    ("mode", "kind", "status"),
    [
        ("500", "http_500: Internal Server Error: engine died", 500),
        ("overlen", "over_length: This model's maximum context length is 128", 400),
        ("bad400", "http_400: Bad Request: bad temperature", 400),
        ("notsse", "not_sse: expected text/event-stream, got application/json", 200),
        ("reset", "connection: ", 200),
        ("inline_error", "server_error: EngineCore died", 200),
        ("stall", "stall: no data from the server for 0.3 s after 2 token chunks", 200),
        ("hang", "stall: no response from the server within 0.3 s", None),
    ],
)
async def test_failures_become_records(fake: Fake, mode: str, kind: str, status: int) -> None:
    r = await one(fake, Spec("x", prompt_text=mode), stall_timeout=0.3)
    assert not r.success and r.error.startswith(kind), r.error
    assert r.http_status == status and r.over_length == (mode == "overlen")
    assert r.finished_at >= (r.sent_at or 0.0)


async def test_total_timeout_and_unreachable_server(fake: Fake) -> None:
    r = await one(fake, Spec("x", prompt_text="stall"), timeout=0.2)
    assert r.error == "timeout: no complete answer within 0.2 s"
    async with make_session() as session:
        r = await send_request(session, "http://127.0.0.1:9", Spec("ok"), model="tiny")
    assert not r.success and r.error.startswith("connection: ")


async def test_mixed_run_completes_and_explains_failures(fake: Fake) -> None:
    modes = ["ok"] * 6 + ["500", "overlen", "notsse", "reset", "stall", "ok"]
    specs = [Spec(f"r{i}", prompt_text=m) for i, m in enumerate(modes)]
    res = await run_load(
        fake.url, specs, LoadOptions(model="tiny", max_concurrency=4, stall_timeout=0.3)
    )
    s = res.summary
    assert len(res.records) == 12 and s["completed"] == 7 and s["failed"] == 5
    assert s["errors_by_kind"] == {
        "connection": 1, "http_500": 1, "not_sse": 1, "over_length": 1, "stall": 1,
    }  # fmt: skip
    assert s["over_length_rejections"] == 1 and s["error_rate"] == pytest.approx(4 / 12)
    assert s["overlength_rate"] == pytest.approx(1 / 12)  # counted once, not as an error
    assert s["total_output_tokens"] == 35 and s["total_input_tokens"] == 7 * 7
    assert TTFT <= s["mean_ttft_ms"] / 1000 < TTFT + SLACK
    assert s["mean_tpot_ms"] > 0 and "p99.9_itl_ms" in s and "p99_e2el_ms" in s
    assert [r.request_id for r in res.records] == [sp.request_id for sp in specs]


async def test_poisson_schedule_is_kept_and_lag_recorded(fake: Fake) -> None:
    rng = random.Random(0)
    t, specs = 0.0, []
    for i in range(25):
        t += rng.expovariate(60.0)
        specs.append(Spec(f"p{i}", arrival=t))
    res = await run_load(fake.url, specs, LoadOptions(model="tiny"))
    for spec, r in zip(specs, res.records, strict=True):
        assert r.scheduled_at == spec.arrival and r.sent_at is not None
        assert 0.0 <= r.sent_at - r.scheduled_at < 0.03  # sends on time, never early
    s = res.summary
    assert s["completed"] == 25 and 0.0 <= s["p99_schedule_lag_ms"] < 30.0
    assert res.duration == pytest.approx(max(r.finished_at for r in res.records))
    assert res.duration >= specs[-1].arrival + TTFT


async def test_time_scale_compresses_the_schedule(fake: Fake) -> None:
    specs = [Spec(f"s{i}", arrival=i * 1.0, output_len=2) for i in range(4)]  # 0..3 engine s
    wall = time.perf_counter()
    res = await run_load(fake.url, specs, LoadOptions(model="tiny", time_scale=10.0))
    # 0.3 s of arrivals at 10x, not 3 s; the margin absorbs a loaded 2-core host (1.1 s seen)
    assert time.perf_counter() - wall < 2.0
    for spec, r in zip(specs, res.records, strict=True):
        assert r.sent_at == pytest.approx(spec.arrival, abs=0.3)  # engine seconds
        assert r.ttft is not None and r.ttft >= 10 * TTFT
    assert res.summary["time_scale"] == 10.0 and res.duration >= 3.0 + 10 * TTFT


@pytest.mark.parametrize("open_loop", [False, True])
async def test_max_concurrency_is_respected(fake: Fake, open_loop: bool) -> None:
    specs = [Spec(f"c{i}", arrival=0.0 if open_loop else None) for i in range(12)]
    res = await run_load(fake.url, specs, LoadOptions(model="tiny", max_concurrency=3))
    assert fake.peak == 3 and res.summary["completed"] == 12
    assert res.summary["max_concurrent_requests"] <= 3
    if open_loop:  # queued requests wait for a slot: that shows up as scheduling lag
        assert res.summary["max_schedule_lag_ms"] > 1000 * TTFT


async def test_warmup_is_sent_first_marked_and_excluded(fake: Fake) -> None:
    specs = [Spec("a", output_len=2), Spec("b", output_len=3)]
    res = await run_load(fake.url, specs, LoadOptions(model="tiny", warmup=3))
    warm = [r for r in res.records if r.warmup]
    assert [r.request_id for r in warm] == ["warmup-0-a", "warmup-1-b", "warmup-2-a"]
    assert all(r.success and r.finished_at <= 0.0 for r in warm)  # before t0
    s = res.summary
    assert s["completed"] == 2 and s["warmup_requests"] == 3 and s["total_output_tokens"] == 5
    assert len(fake.bodies) == 5


async def test_duration_bound_and_drain_timeout(fake: Fake) -> None:
    specs = [Spec("h", prompt_text="hang", arrival=0.0)]
    specs += [Spec(f"t{i}", arrival=0.1 * i) for i in range(1, 10)]  # 0.1 .. 0.9 s
    wall = time.perf_counter()
    res = await run_load(
        fake.url, specs, LoadOptions(model="tiny", duration=0.35, drain_timeout=0.4)
    )
    assert time.perf_counter() - wall < 1.5
    assert [r.request_id for r in res.records] == ["h", "t1", "t2", "t3"]
    hung = res.records[0]
    assert hung.error == "cancelled: at drain timeout" and hung.sent_at is not None
    assert res.summary["completed"] == 3 and res.summary["errors_by_kind"] == {"cancelled": 1}
    await asyncio.sleep(0.05)
    assert fake.in_flight == 0  # the server saw the cancelled request's connection close


async def test_closed_loop_duration_bound(fake: Fake) -> None:
    specs = [Spec(f"c{i}", output_len=2) for i in range(100)]
    res = await run_load(
        fake.url, specs, LoadOptions(model="tiny", max_concurrency=2, duration=0.2)
    )
    assert 2 <= len(res.records) < 20 and res.summary["failed"] == 0
    assert all(r.sent_at is not None and r.sent_at < 0.2 for r in res.records)


async def test_cancelling_run_load_leaves_nothing_behind(fake: Fake) -> None:
    specs = [Spec(f"h{i}", prompt_text="hang") for i in range(5)]
    before = asyncio.all_tasks()
    task = asyncio.create_task(run_load(fake.url, specs, LoadOptions(model="tiny")))
    while fake.in_flight < 5:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert fake.in_flight == 0  # every connection was closed
    leftover = [t for t in asyncio.all_tasks() - before if "LoadRun." in repr(t.get_coro())]
    assert leftover == []


async def test_progress_snapshots(fake: Fake) -> None:
    seen: list[ProgressSnapshot] = []
    specs = [Spec(f"p{i}", arrival=0.02 * i) for i in range(5)]
    await run_load(
        fake.url, specs, LoadOptions(model="tiny", progress_interval=0.0), progress=seen.append
    )
    assert seen[-1].phase == "done" and seen[-1].completed == 5 and seen[-1].in_flight == 0
    assert all(s.planned == 5 for s in seen) and any(s.phase == "run" for s in seen)


async def test_bad_arguments_fail_before_sending(fake: Fake) -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        await run_load(fake.url, [Spec("a")], LoadOptions(model="tiny", max_concurrency=0))
    with pytest.raises(ConfigError, match="goodput"):
        await run_load(fake.url, [Spec("a")], LoadOptions(model="tiny", goodput_slos={"foo": 1.0}))
    assert fake.bodies == []


async def test_probe_server(fake: Fake) -> None:
    info = await probe_server(fake.url + "/v1/")
    assert (info.model_id, info.max_model_len, info.version) == ("tiny", 128, "0.32.0")
    assert info.time_scale == 10.0 and info.models == ("tiny",)
    with pytest.raises(ServiceError, match=r"^cannot reach server at http://127\.0\.0\.1:9: "):
        await probe_server("http://127.0.0.1:9", timeout=2.0)


def test_workload_request_satisfies_request_spec() -> None:
    from autotune.workload.core import WorkloadRequest

    req = WorkloadRequest(prompt_len=3, output_len=2, prompt_text="hi", request_id="x")
    assert isinstance(req, RequestSpec)


async def test_session_limit_is_explicit() -> None:
    async with make_session() as s:
        assert isinstance(s.connector, aiohttp.TCPConnector) and s.connector.limit == 0
    async with make_session(7) as s:
        assert s.connector is not None and s.connector.limit == 7
