"""autotune.loadgen.bench_stats and .sse: hand-computed examples, pure functions only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.errors import ConfigError
from autotune.loadgen import RequestRecord, error_kind, peak_concurrency, summarize, windowed
from autotune.loadgen.bench_stats import percentile_key
from autotune.loadgen.sse import SSEParser


def ok(
    rid: str,
    ttft: float,
    e2el: float,
    n: int,
    *,
    sent: float = 0.0,
    itl: list[float] | None = None,
    prompt_len: int = 10,
    prompt_tokens: int | None = None,
    warmup: bool = False,
) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        success=True,
        prompt_len=prompt_len,
        prompt_tokens=prompt_tokens,
        output_tokens=n,
        scheduled_at=sent,
        sent_at=sent,
        first_token_at=sent + ttft,
        last_token_at=sent + e2el,
        finished_at=sent + e2el,
        itl=itl if itl is not None else [],
        ttft=ttft,
        e2el=e2el,
        warmup=warmup,
    )


def failed(rid: str, error: str, *, sent: float = 0.0, end: float = 0.1) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        error=error,
        prompt_len=10,
        scheduled_at=sent,
        sent_at=sent,
        finished_at=end,
        ttft=5.0,  # garbage a failed request may carry: must not reach the statistics
        e2el=9.0,
        itl=[7.0],
        output_tokens=3,
    )


def test_percentiles_match_numpy_linear_and_vllm_key_spelling() -> None:
    recs = [ok(f"r{i}", t, 1.0, 1) for i, t in enumerate([0.1, 0.2, 0.3, 0.4])]
    s = summarize(recs, 1.0, percentiles=(50, 90, 99, 99.9))
    # Linear interpolation by hand: rank p/100 * (n - 1) between sorted neighbours.
    assert s["p50_ttft_ms"] == pytest.approx(250.0)
    assert s["p90_ttft_ms"] == pytest.approx(370.0)  # 0.3 + 0.7 * 0.1
    assert s["p99_ttft_ms"] == pytest.approx(397.0)
    assert s["p99.9_ttft_ms"] == pytest.approx(399.7)
    assert s["mean_ttft_ms"] == pytest.approx(250.0)
    assert s["median_ttft_ms"] == pytest.approx(250.0)
    assert s["std_ttft_ms"] == pytest.approx(math.sqrt(0.0125) * 1000)  # population std
    assert s["p90_ttft_ms"] == pytest.approx(np.percentile([100, 200, 300, 400], 90))
    assert [percentile_key(p) for p in (50, 99.0, 99.9, 0.1)] == ["p50", "p99", "p99.9", "p0.1"]


def test_tpot_per_request_and_itl_pooled() -> None:
    a = ok("a", 0.2, 1.0, 5, itl=[0.2, 0.2, 0.2, 0.2])  # TPOT (1.0 - 0.2) / 4 = 0.2
    b = ok("b", 0.1, 0.4, 4, itl=[0.1, 0.1, 0.1])  # TPOT 0.1
    c = ok("c", 0.3, 0.3, 1)  # one token: no TPOT sample
    s = summarize([a, b, c], 2.0, percentiles=(50,))
    assert s["mean_tpot_ms"] == pytest.approx(150.0)
    assert s["median_tpot_ms"] == pytest.approx(150.0)
    assert s["mean_itl_ms"] == pytest.approx(np.mean([200] * 4 + [100] * 3))
    assert s["mean_e2el_ms"] == pytest.approx((1000 + 400 + 300) / 3)
    assert c.tpot == 0.0 and a.tpot == pytest.approx(0.2)


def test_throughputs_tokens_and_server_prompt_count() -> None:
    recs = [ok("a", 0.1, 0.5, 10, prompt_tokens=12), ok("b", 0.1, 0.5, 20, prompt_len=30)]
    s = summarize(recs, 4.0)
    assert s["completed"] == 2 and s["failed"] == 0
    assert s["total_input_tokens"] == 42  # usage's 12 beats the planned 10
    assert s["total_output_tokens"] == 30
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["output_throughput"] == pytest.approx(7.5)
    assert s["total_token_throughput"] == pytest.approx(18.0)
    assert s["request_goodput"] is None
    assert s["duration"] == 4.0


def test_goodput_is_inclusive_and_needs_every_slo() -> None:
    exact = ok("exact", 0.25, 1.25, 5)  # TPOT 0.25 s: binary-exact values on the boundary
    slow_ttft = ok("slow", 0.2500001, 1.0, 5)
    slow_tpot = ok("tpot", 0.1, 1.2, 2)  # TPOT 1.1 s
    one_token = ok("one", 0.1, 0.1, 1)  # TPOT counts as 0 for n <= 1
    recs = [exact, slow_ttft, slow_tpot, one_token]
    s = summarize(recs, 2.0, goodput_slos={"ttft": 250.0, "tpot": 250.0})
    assert s["request_goodput"] == pytest.approx(2 / 2.0)  # exact + one_token
    s = summarize(recs, 2.0, goodput_slos={"e2el": 1250.0})
    assert s["request_goodput"] == pytest.approx(4 / 2.0)
    with pytest.raises(ConfigError, match="unknown goodput SLO 'itl'"):
        summarize(recs, 1.0, goodput_slos={"itl": 5.0})
    with pytest.raises(ConfigError, match="non-negative"):
        summarize(recs, 1.0, goodput_slos={"ttft": -1.0})


def test_warmup_records_are_excluded() -> None:
    recs = [ok("w", 9.0, 9.5, 50, warmup=True, sent=-10.0), ok("a", 0.1, 0.2, 2)]
    s = summarize(recs, 1.0)
    assert s["completed"] == 1 and s["total_output_tokens"] == 2
    assert s["mean_ttft_ms"] == pytest.approx(100.0)
    assert s["warmup_requests"] == 1 and s["max_concurrent_requests"] == 1


def test_failed_requests_count_but_stay_out_of_latency() -> None:
    recs = [
        ok("a", 0.1, 0.3, 3, itl=[0.1, 0.1]),
        failed("b", "http_500: Internal Server Error: boom"),
        failed("c", "stall: no data from the server for 1 s after 2 token chunks"),
        failed("d", "http_500: Internal Server Error: again"),
        RequestRecord("e", error="over_length: too long", over_length=True, http_status=400),
    ]
    s = summarize(recs, 1.0)
    assert s["completed"] == 1 and s["failed"] == 4
    # one definition (docs/tuning.md#3-the-per-level-record): the over-length rejection is
    # counted in the over-length rate, not as an error
    assert s["error_rate"] == pytest.approx(0.6) and s["overlength_rate"] == pytest.approx(0.2)
    assert s["errors_by_kind"] == {"http_500": 2, "over_length": 1, "stall": 1}
    assert s["over_length_rejections"] == 1
    assert s["mean_ttft_ms"] == pytest.approx(100.0) and s["p99_itl_ms"] == pytest.approx(100.0)
    assert s["total_output_tokens"] == 3 and s["total_input_tokens"] == 10
    assert error_kind("just text") == "other" and error_kind("") == "other"


def test_empty_run_reports_zeros_like_vllm() -> None:
    s = summarize([], 0.0)
    assert s["completed"] == 0 and s["request_throughput"] == 0.0
    assert s["mean_ttft_ms"] == 0.0 and s["p99.9_e2el_ms"] == 0.0
    assert s["error_rate"] == 0.0 and s["max_concurrent_requests"] == 0


def test_peak_concurrency_sweep_line() -> None:
    assert peak_concurrency([(0, 2), (1, 3), (2, 4)]) == 2  # touching intervals do not overlap
    assert peak_concurrency([(0, 5), (1, 2), (1.5, 3)]) == 3
    assert peak_concurrency([]) == 0
    recs = [
        ok("a", 0.1, 2.0, 2, sent=0.0),
        ok("b", 0.1, 2.0, 2, sent=1.0),
        failed("c", "x: y", sent=1.5, end=1.8),
    ]
    assert summarize(recs, 3.0)["max_concurrent_requests"] == 3  # a failed one held a slot


def test_schedule_lag_and_peak_output_rate() -> None:
    a = ok("a", 0.1, 0.3, 3, sent=0.01, itl=[0.1, 0.1])  # chunks at 0.11, 0.21, 0.31
    a.scheduled_at = 0.0
    b = ok("b", 0.5, 0.6, 2, sent=1.0, itl=[0.1])  # chunks at 1.5, 1.6
    s = summarize([a, b], 2.0)
    assert s["mean_schedule_lag_ms"] == pytest.approx(5.0)
    assert s["max_schedule_lag_ms"] == pytest.approx(10.0)
    assert s["max_output_tokens_per_s"] == 3.0  # bucket [0.01, 1.01) holds a's 3 chunks


def test_windowed_assigns_requests_by_finish_time() -> None:
    recs = [
        ok("a", 0.1, 0.5, 4, sent=0.0),  # finishes 0.5 -> window 0
        ok("b", 0.3, 1.5, 6, sent=0.0),  # 1.5 -> window 1
        ok("c", 0.2, 0.5, 2, sent=1.4),  # 1.9 -> window 1
        failed("d", "stall: x", end=0.7),
        ok("w", 0.1, 0.2, 1, warmup=True, sent=-1.0),
    ]
    w = windowed(recs, 1.0)
    assert [x["completed"] for x in w] == [1, 2] and [x["failed"] for x in w] == [1, 0]
    assert w[0]["p99_ttft_ms"] == pytest.approx(100.0)
    assert w[1]["p99_ttft_ms"] == pytest.approx(np.percentile([300.0, 200.0], 99))
    assert w[1]["output_throughput"] == pytest.approx(8.0)
    assert w[1]["start"] == 1.0 and w[1]["end"] == 2.0
    assert windowed([], 1.0) == []
    with pytest.raises(ConfigError):
        windowed(recs, 0.0)


def test_sse_parser_handles_split_reads_crlf_comments_and_eof() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a"') == []
    assert p.feed(b": 1}\n\n: keep-alive\r\n\r\ndata: x\r\ndata: y\r\n\r\ndata: [DO") == [
        '{"a": 1}',
        "x\ny",
    ]
    assert p.feed(b"NE]\n\nevent: ping\n\n") == ["[DONE]"]
    assert p.feed(b"data:tail") == []
    assert p.close() == ["tail"]  # unterminated last event is still delivered
    assert p.saw_field
