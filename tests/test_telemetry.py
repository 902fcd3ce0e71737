"""Telemetry without a server: parsing real and old-style pages, level summaries, and the
diagnosis rules on hand-made metric series (with and without mid-level scrapes)."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.errors import ConfigError, ServiceError
from autotune.sim.exposition import VllmMetrics
from autotune.telemetry import (
    KINDS,
    HistogramDelta,
    LevelTelemetry,
    PrometheusTelemetry,
    Snapshot,
    diagnose,
    parse_metrics,
    summarize,
    write_sd_targets,
)
from autotune.telemetry.diagnosis import QUEUE_HIGH_SHARE, SATURATED_MIN

CAPTURES = Path(__file__).parent / "data" / "captures"
MODEL = "tiny"


def capture(name: str) -> str:
    path = CAPTURES / name
    return path.read_text()


# -- parsing ---------------------------------------------------------------------------------


def test_parse_real_captures_and_their_deltas() -> None:
    before = parse_metrics(capture("metrics_before.txt"), t=0.0)
    after = parse_metrics(capture("metrics_after.txt"), t=60.0)
    assert before.counters["vllm:generation_tokens"] == 0
    assert after.counters["vllm:generation_tokens"] == 64640
    assert after.counters["vllm:prompt_tokens"] == 10651
    assert after.counters["vllm:prefix_cache_queries"] == 10651
    assert after.labeled["vllm:request_success"]["length"] == 155
    assert after.gauges["vllm:kv_cache_usage_perc"] == 0.0
    assert not any(n.endswith("_created") for n in [*after.counters, *after.gauges])
    it = after.histograms["vllm:iteration_tokens_total"]  # a histogram despite `_total`
    assert it.count == 5762 and it.sum == 75291 and it.buckets[-1] == (math.inf, 5762)
    assert after.cache_config is not None and after.cache_config["num_gpu_blocks"] == "16384"
    tel = summarize(before, after, max_num_seqs=16, max_num_batched_tokens=2048)
    assert tel.counters["generation_tokens"] == 64640 and tel.request_success["length"] == 155
    assert tel.mean_queue_time_s == pytest.approx(113.30023613200012 / 155)
    ttft = tel.histograms["ttft"]
    p50 = ttft.quantile(0.5)
    assert p50 is not None and 0 < p50 < 2.5
    assert tel.gauges == {} and tel.saturated_fraction is None  # no mid-level samples
    json.dumps(tel.to_dict(), allow_nan=False)


OLD_PAGE = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.97
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 500.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.2
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions{engine="1",model_name="m"} 2.0
"""


def test_old_names_and_untyped_counters() -> None:
    snap = parse_metrics(OLD_PAGE, t=1.0)
    assert snap.gauges["vllm:kv_cache_usage_perc"] == 0.97
    assert snap.counters["vllm:prefix_cache_queries"] == 500
    assert snap.counters["vllm:prefix_cache_hits"] == 200
    itl = snap.histograms["vllm:inter_token_latency_seconds"]
    assert itl.count == 4 and itl.buckets == ((0.01, 3.0), (math.inf, 4.0))
    # untyped: `_total`, and a bare known counter name, are both counters (and add up)
    assert snap.counters["vllm:num_preemptions"] == 9


def test_old_and_new_name_together_count_once() -> None:
    # v0.10 exposes the deprecated and the current name with the same values.
    page = (
        OLD_PAGE
        + """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 500.0
"""
    )
    snap = parse_metrics(page)
    assert snap.gauges["vllm:kv_cache_usage_perc"] == 0.5
    assert snap.counters["vllm:prefix_cache_queries"] == 500


def test_engines_add_up_but_kv_usage_takes_the_worst() -> None:
    page = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9
"""
    snap = parse_metrics(page)
    assert snap.gauges["vllm:num_requests_running"] == 7
    assert snap.gauges["vllm:kv_cache_usage_perc"] == 0.9


def test_malformed_page_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:x{engine=0 1\n")


# -- hand-made metric series -----------------------------------------------------------------


class FakeEngine:
    """Drives the simulated server's metric families by hand and snapshots its page."""

    def __init__(self) -> None:
        self.m = VllmMetrics(MODEL, 8192, {})

    def steps(
        self,
        n: int,
        *,
        tokens: int,
        running: int,
        waiting: int,
        kv: float = 0.1,
        preempt_every: int = 0,
    ) -> None:
        for i in range(n):
            self.m.observe_step(
                iteration_tokens=tokens,
                prompt_tokens=tokens - running,
                generation_tokens=running,
                running=running,
                waiting=waiting,
                kv_usage=kv,
                preemptions=int(bool(preempt_every) and i % preempt_every == 0),
                prefix_queries=0,
                prefix_hits=0,
            )

    def finish(self, n: int, *, queue: float, e2e: float) -> None:
        for _ in range(n):
            self.m.observe_finished(
                finished_reason="length",
                prompt_tokens=100,
                generation_tokens=50,
                max_tokens=50,
                n=1,
                arrival=0.0,
                scheduled=queue,
                first_token=queue + 0.05,
                finish=e2e,
                num_preemptions=0,
                prefill_computed_tokens=100,
                cached_prompt_tokens=0,
            )

    def snap(self, t: float) -> Snapshot:
        return parse_metrics(self.m.render().decode(), t=t)


def level(
    *,
    tokens: int,
    running: int,
    waiting: int,
    queue: float,
    e2e: float = 2.0,
    kv: float = 0.1,
    preempt_every: int = 0,
    finished: int = 20,
    mid: int = 4,
    mns: int = 64,
    mnbt: int = 2048,
) -> tuple[LevelTelemetry, LevelTelemetry]:
    """(with mid-level samples, before/after only) for one steady level of ``mid`` seconds."""
    eng = FakeEngine()
    eng.steps(3, tokens=5, running=1, waiting=0)  # earlier traffic: deltas must remove it
    eng.finish(2, queue=0.0, e2e=0.5)
    before = eng.snap(0.0)
    samples = []
    for i in range(mid):
        eng.steps(
            50, tokens=tokens, running=running, waiting=waiting, kv=kv, preempt_every=preempt_every
        )
        samples.append(eng.snap(i + 1.0))
    eng.finish(finished, queue=queue, e2e=e2e)
    eng.steps(1, tokens=1, running=0, waiting=0, kv=0.0)  # drained
    after = eng.snap(mid + 1.0)
    full = summarize(
        before, after, samples, max_num_seqs=mns, max_num_batched_tokens=mnbt, missed=0
    )
    bare = summarize(before, after, (), max_num_seqs=mns, max_num_batched_tokens=mnbt, missed=mid)
    return full, bare


def kinds(
    pair: tuple[LevelTelemetry, LevelTelemetry], mns: int = 64, mnbt: int = 2048
) -> tuple[str, str]:
    a, b = (diagnose(t, max_num_seqs=mns, max_num_batched_tokens=mnbt) for t in pair)
    return a.kind, b.kind


def test_summary_deltas_and_gauges() -> None:
    full, bare = level(tokens=2048, running=10, waiting=3, queue=1.0, preempt_every=10)
    assert full.counters["preemptions"] == 20 == bare.counters["preemptions"]
    assert full.request_success["length"] == 20 and full.finished == 20
    assert full.histograms["iteration_tokens"].count == 201  # 4 x 50 steps + the drain step
    assert full.mean_queue_time_s == pytest.approx(1.0)
    assert full.gauges["running"].max == 10 and full.gauges["waiting"].mean == 3
    assert full.gauges["kv_usage"].time_weighted_mean == pytest.approx(0.1)
    assert bare.gauges == {} and bare.missed_scrapes == 4 and bare.has_deltas
    use = full.budget_use()
    assert use is not None and use.near_fraction == pytest.approx(200 / 201)
    assert use.near_min_tokens == 1024  # the bucket (1024, 2048] holds the budget: coarse
    # the gauges and the preemption count over the level's time (one point per sample here)
    assert full.series is not None and bare.series is None
    assert full.series["t"] == [1.0, 2.0, 3.0, 4.0] and full.series["running"] == [10.0] * 4
    assert full.series["preemptions"] == [5.0, 10.0, 15.0, 20.0]  # counted from the start
    d = full.to_dict()
    assert d["series"] == dict(full.series)
    assert d["histograms"]["queue_time"]["quantiles_note"].startswith("server-side")
    assert set(d["histograms"]["ttft"]["coarse_quantiles"]) == {"p50", "p90", "p99"}
    json.dumps(d, allow_nan=False)


def test_counter_reset_counts_from_zero() -> None:
    eng = FakeEngine()
    eng.steps(10, tokens=8, running=1, waiting=0, preempt_every=1)
    before = eng.snap(0.0)
    restarted = FakeEngine()
    restarted.steps(3, tokens=8, running=1, waiting=0, preempt_every=1)
    tel = summarize(before, restarted.snap(5.0))
    assert tel.counters["preemptions"] == 3
    assert tel.histograms["iteration_tokens"].count == 3


def test_histogram_quantile_like_promql() -> None:
    h = HistogramDelta(((1.0, 2.0), (2.0, 6.0), (math.inf, 8.0)), 10.0, 8.0)
    assert h.quantile(0.25) == pytest.approx(1.0)
    assert h.quantile(0.5) == pytest.approx(1.5)
    assert h.quantile(0.99) == 2.0  # in +Inf: the highest finite bound
    assert HistogramDelta(((1.0, 0.0), (math.inf, 0.0)), 0.0, 0.0).quantile(0.5) is None


def test_memory_bound_from_preemption_delta_alone() -> None:
    pair = level(tokens=300, running=40, waiting=10, queue=1.0, preempt_every=25)
    assert kinds(pair) == ("memory-bound", "memory-bound")
    d = diagnose(pair[1], max_num_seqs=64, max_num_batched_tokens=2048)
    assert d.evidence["preemptions"] == 8 and "max_num_seqs" in d.suggestion


def test_memory_bound_from_sampled_kv_usage() -> None:
    pair = level(tokens=300, running=40, waiting=10, queue=1.0, kv=0.97)
    assert kinds(pair) == ("memory-bound", "concurrency-capped")  # samples lost: no KV view
    assert diagnose(pair[0], max_num_seqs=64, max_num_batched_tokens=2048).evidence[
        "kv_usage_max"
    ] == pytest.approx(0.97)


def test_token_budget_bound_with_and_without_samples() -> None:
    pair = level(tokens=2048, running=12, waiting=20, queue=1.5, e2e=2.0)
    assert kinds(pair) == ("token-budget-bound", "token-budget-bound")
    d = diagnose(pair[1], max_num_seqs=64, max_num_batched_tokens=2048)
    assert d.evidence["near_budget_fraction"] > 0.9 and "max_num_batched_tokens" in d.suggestion


def test_concurrency_capped_with_and_without_samples() -> None:
    pair = level(tokens=70, running=64, waiting=30, queue=1.5, e2e=2.0)
    assert kinds(pair) == ("concurrency-capped", "concurrency-capped")
    d = diagnose(pair[0], max_num_seqs=64, max_num_batched_tokens=2048)
    assert d.evidence["saturated_fraction"] >= SATURATED_MIN
    assert d.evidence["budget_utilization"] < 0.1


def test_sampled_saturation_decides_a_moderate_queue() -> None:
    pair = level(tokens=70, running=64, waiting=5, queue=0.2, e2e=2.0)  # 10 % share
    assert kinds(pair) == ("concurrency-capped", "inconclusive")


def test_cap_not_reached_while_waiting_is_not_a_cap() -> None:
    # Queueing, small steps, but running stays at 20 of 64: KV admission, not max_num_seqs.
    pair = level(tokens=30, running=20, waiting=10, queue=1.5, e2e=2.0, kv=0.8)
    assert kinds(pair) == ("inconclusive", "concurrency-capped")


def test_headroom() -> None:
    pair = level(tokens=40, running=8, waiting=0, queue=0.005, e2e=1.0)
    assert kinds(pair) == ("headroom", "headroom")
    d = diagnose(pair[1], max_num_seqs=64, max_num_batched_tokens=2048)
    assert "more load" in d.suggestion and d.evidence["preemptions"] == 0


def test_inconclusive_cases() -> None:
    mid = level(tokens=600, running=8, waiting=1, queue=QUEUE_HIGH_SHARE / 2, e2e=1.0)
    assert kinds(mid) == ("inconclusive", "inconclusive")
    few = level(tokens=2048, running=8, waiting=9, queue=1.5, finished=2)
    assert kinds(few)[1] == "inconclusive"
    # before snapshot lost and no samples: nothing to go on
    full, _ = level(tokens=2048, running=8, waiting=9, queue=1.5)
    lost = replace(
        full,
        has_deltas=False,
        counters={},
        request_success={},
        histograms={},
        gauges={},
        saturated_fraction=None,
    )
    d = diagnose(lost, max_num_seqs=64, max_num_batched_tokens=2048)
    assert d.kind == "inconclusive" and "snapshot" in d.suggestion
    assert all(d.kind in KINDS for d in [d])


def test_diagnosis_is_json_ready() -> None:
    full, _ = level(tokens=2048, running=12, waiting=20, queue=1.5)
    d = diagnose(full, max_num_seqs=64, max_num_batched_tokens=2048)
    out = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert out["kind"] == "token-budget-bound" and isinstance(out["evidence"]["steps"], float)


# -- service discovery file ------------------------------------------------------------------


def test_write_sd_targets_atomically(tmp_path: Path) -> None:
    path = tmp_path / "autotune.json"
    write_sd_targets(
        path, [("127.0.0.1:8001", {"trial": "7", "study": "s"}), ("[::1]:8002", {"trial": "8"})]
    )
    groups = json.loads(path.read_text())
    assert groups == [
        {"targets": ["127.0.0.1:8001"], "labels": {"trial": "7", "study": "s"}},
        {"targets": ["[::1]:8002"], "labels": {"trial": "8"}},
    ]
    write_sd_targets(path, [])
    assert json.loads(path.read_text()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["autotune.json"]  # no temp file left
    with pytest.raises(ConfigError, match="host:port"):
        write_sd_targets(path, [("http://x:1", {})])
    with pytest.raises(ConfigError, match="label"):
        write_sd_targets(path, [("x:1", {"__bad": "1"})])
    with pytest.raises(ConfigError, match="cannot write"):
        write_sd_targets(tmp_path / "missing" / "t.json", [])


def test_unreachable_prometheus_is_a_one_line_service_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    prom = PrometheusTelemetry(f"http://127.0.0.1:{port}", timeout_s=2.0)
    with pytest.raises(ServiceError, match=r"^Prometheus at http://127\.0\.0\.1:\d+: ") as err:
        prom.check()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "autotune.telemetry",
        "autotune.telemetry.scrape",
        "autotune.telemetry.stats",
        "autotune.telemetry.summary",
        "autotune.telemetry.diagnosis",
        "autotune.telemetry.prometheus",
    ],
)
def test_public_names(name: str) -> None:
    module = importlib.import_module(name)
    assert all(hasattr(module, n) for n in module.__all__)
    defined = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert defined <= set(module.__all__)
