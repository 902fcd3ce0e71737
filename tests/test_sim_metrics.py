"""The simulated /metrics page against a real vLLM 0.32 page, and what observe_* moves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autotune.sim.exposition import VllmMetrics
from autotune.sim.vllm_page import CACHE_CONFIG_DEFAULTS, build_1_2_5_buckets

CAPTURES = Path(__file__).parent / "data" / "captures"
MODEL = "/models/tiny-llama"  # the captured server's model name and max_model_len
MAX_MODEL_LEN = 1024

Key = tuple[str, frozenset[tuple[str, str]]]


def capture(name: str) -> str:
    path = CAPTURES / name
    return path.read_text()


def families(text: str) -> dict[str, str]:
    """``vllm:`` family name -> type, as a scraper parses it (`_created` families included)."""
    return {
        f.name: f.type for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")
    }


def samples(text: str) -> dict[Key, float]:
    """(sample name, labels) -> value for every ``vllm:`` sample."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:")
        for s in f.samples
    }


def vllm_lines(text: str) -> list[str]:
    """The ``vllm:`` lines without the wall-clock `_created` series."""
    return [line for line in text.splitlines() if "vllm:" in line and "_created" not in line]


def page(m: VllmMetrics) -> str:
    return m.render().decode()


def value(m: VllmMetrics, name: str, **labels: str) -> float:
    base = {"model_name": MODEL, "engine": "0"}
    return samples(page(m))[(name, frozenset({**base, **labels}.items()))]


def buckets(text: str, family: str) -> list[str]:
    return [
        s.labels["le"]
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
        if s.name == family + "_bucket"
    ]


@pytest.fixture
def metrics() -> VllmMetrics:
    return VllmMetrics(MODEL, MAX_MODEL_LEN, {})


def test_page_parses_and_has_the_captured_families_and_types(metrics: VllmMetrics) -> None:
    mine = families(page(metrics))
    for name in ("metrics_before.txt", "metrics_after.txt"):
        assert mine == families(capture(name))
    base = {n for n in mine if not n.endswith("_created")}
    assert len(base) == 39 and len(mine) == 72  # 39 families + 33 `_created` gauges


def test_fresh_page_equals_the_captured_startup_page(metrics: VllmMetrics) -> None:
    # Same order, HELP, TYPE, labels, buckets and values (the capture was taken before any
    # request); only the wall-clock `_created` timestamps differ.
    assert vllm_lines(page(metrics)) == vllm_lines(capture("metrics_before.txt"))


def test_label_sets_match_the_capture(metrics: VllmMetrics) -> None:
    mine = {(name, frozenset(k for k, _ in labels)) for name, labels in samples(page(metrics))}
    real = {
        (name, frozenset(k for k, _ in labels))
        for name, labels in samples(capture("metrics_after.txt"))
    }
    assert mine == real
    text = page(metrics)
    assert 'vllm:admission_rejections_total{model_name="/models/tiny-llama",reason=' in text
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert "model_name" not in info and 'engine="0"' in info


@pytest.mark.parametrize(
    "family",
    [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:iteration_tokens_total",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_params_n",
        "vllm:request_num_preemptions",
    ],
)
def test_buckets_match_the_capture(metrics: VllmMetrics, family: str) -> None:
    assert buckets(page(metrics), family) == buckets(capture("metrics_after.txt"), family)


def test_buckets_match_vllm_md_without_the_captures(metrics: VllmMetrics) -> None:
    # docs/vllm.md#63-histogram-buckets, so the bucket check still bites without the captures.
    text = page(metrics)
    assert buckets(text, "vllm:time_to_first_token_seconds")[:3] == ["0.001", "0.005", "0.01"]
    assert buckets(text, "vllm:time_to_first_token_seconds")[-3:] == ["640.0", "2560.0", "+Inf"]
    assert buckets(text, "vllm:inter_token_latency_seconds")[:2] == ["0.01", "0.025"]
    assert len(buckets(text, "vllm:inter_token_latency_seconds")) == 20
    assert buckets(text, "vllm:e2e_request_latency_seconds")[:3] == ["0.3", "0.5", "0.8"]
    assert buckets(text, "vllm:e2e_request_latency_seconds")[-2:] == ["7680.0", "+Inf"]
    assert buckets(text, "vllm:iteration_tokens_total") == [
        "1.0",
        "8.0",
        "16.0",
        "32.0",
        "64.0",
        "128.0",
        "256.0",
        "512.0",
        "1024.0",
        "2048.0",
        "4096.0",
        "8192.0",
        "16384.0",
        "+Inf",
    ]


def test_build_1_2_5_buckets() -> None:
    assert build_1_2_5_buckets(1024) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert build_1_2_5_buckets(1) == [1]
    assert build_1_2_5_buckets(131072)[-3:] == [20000, 50000, 100000]
    m = VllmMetrics(MODEL, 8192, {})
    assert buckets(page(m), "vllm:request_generation_tokens")[-2:] == ["5000.0", "+Inf"]


def test_cache_labels_override_the_defaults() -> None:
    m = VllmMetrics(
        MODEL,
        MAX_MODEL_LEN,
        {"block_size": "16", "num_gpu_blocks": "2810", "gpu_memory_utilization": "0.9"},
    )
    info = next(
        f for f in text_string_to_metric_families(page(m)) if f.name == "vllm:cache_config_info"
    )
    (sample,) = info.samples
    assert sample.value == 1.0
    assert sample.labels == {
        **CACHE_CONFIG_DEFAULTS,
        "engine": "0",
        "block_size": "16",
        "num_gpu_blocks": "2810",
        "gpu_memory_utilization": "0.9",
    }
    with pytest.raises(ValueError, match="num_gpu_blokcs"):
        VllmMetrics(MODEL, MAX_MODEL_LEN, {"num_gpu_blokcs": "1"})


def test_instances_have_separate_registries() -> None:
    a, b = VllmMetrics(MODEL, MAX_MODEL_LEN, {}), VllmMetrics(MODEL, MAX_MODEL_LEN, {})
    a.observe_itl([0.5])
    assert value(a, "vllm:inter_token_latency_seconds_count") == 1
    assert value(b, "vllm:inter_token_latency_seconds_count") == 0
    assert VllmMetrics.CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_observe_step_moves_counters_and_sets_gauges_to_the_last_step(metrics: VllmMetrics) -> None:
    metrics.observe_step(
        iteration_tokens=300,
        prompt_tokens=290,
        generation_tokens=10,
        running=10,
        waiting=5,
        kv_usage=0.5,
        preemptions=0,
        prefix_queries=290,
        prefix_hits=128,
    )
    metrics.observe_step(
        iteration_tokens=12,
        prompt_tokens=0,
        generation_tokens=12,
        running=12,
        waiting=3,
        kv_usage=0.75,
        preemptions=2,
        prefix_queries=0,
        prefix_hits=0,
    )

    def v(name: str, **labels: str) -> float:
        return value(metrics, name, **labels)

    assert v("vllm:num_requests_running") == 12 and v("vllm:num_requests_waiting") == 3
    assert v("vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert v("vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert v("vllm:kv_cache_usage_perc") == 0.75
    assert v("vllm:prompt_tokens_total") == 290 and v("vllm:generation_tokens_total") == 22
    assert v("vllm:num_preemptions_total") == 2
    assert v("vllm:prefix_cache_queries_total") == 290
    assert v("vllm:prefix_cache_hits_total") == 128
    assert v("vllm:iteration_tokens_total_count") == 2
    assert v("vllm:iteration_tokens_total_sum") == 312
    assert v("vllm:iteration_tokens_total_bucket", le="8.0") == 0
    assert v("vllm:iteration_tokens_total_bucket", le="16.0") == 1
    assert v("vllm:iteration_tokens_total_bucket", le="256.0") == 1
    assert v("vllm:iteration_tokens_total_bucket", le="512.0") == 2


def test_observe_itl(metrics: VllmMetrics) -> None:
    metrics.observe_itl([0.01, 0.02, 0.5])
    metrics.observe_itl([])
    assert value(metrics, "vllm:inter_token_latency_seconds_count") == 3
    assert value(metrics, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.53)
    le = {
        b: value(metrics, "vllm:inter_token_latency_seconds_bucket", le=b)
        for b in ("0.01", "0.025", "0.4", "0.5")
    }
    assert le == {"0.01": 1, "0.025": 2, "0.4": 2, "0.5": 3}


def test_two_finished_requests_hand_computed(metrics: VllmMetrics) -> None:
    # A: 100-token prompt, 11 tokens to max_tokens; queue 0.2 s, prefill 0.05 s, decode 1 s.
    metrics.observe_finished(
        finished_reason="length",
        prompt_tokens=100,
        generation_tokens=11,
        max_tokens=11,
        n=1,
        arrival=0.0,
        scheduled=0.2,
        first_token=0.25,
        finish=1.25,
        num_preemptions=0,
        prefill_computed_tokens=100,
        cached_prompt_tokens=0,
    )
    # B: 600-token prompt (512 cached), stops after 1 token, max_tokens unset, n=2, preempted
    # 3 times; queue 2 s, prefill 0.5 s, decode 2 s.
    metrics.observe_finished(
        finished_reason="stop",
        prompt_tokens=600,
        generation_tokens=1,
        max_tokens=0,
        n=2,
        arrival=1.0,
        scheduled=3.0,
        first_token=3.5,
        finish=5.5,
        num_preemptions=3,
        prefill_computed_tokens=88,
        cached_prompt_tokens=512,
    )

    def v(name: str, **labels: str) -> float:
        return value(metrics, "vllm:" + name, **labels)

    assert v("request_success_total", finished_reason="length") == 1
    assert v("request_success_total", finished_reason="stop") == 1
    assert v("request_success_total", finished_reason="abort") == 0
    # e2e 1.25 and 4.5; TTFT 0.25 and 2.5 (le is inclusive); TPOT 1/10 and 0 (one token).
    assert (v("e2e_request_latency_seconds_count"), v("e2e_request_latency_seconds_sum")) == (
        2,
        5.75,
    )
    assert [
        v("e2e_request_latency_seconds_bucket", le=b) for b in ("1.0", "1.5", "2.5", "5.0")
    ] == [0, 1, 1, 2]
    assert v("time_to_first_token_seconds_sum") == 2.75
    assert [v("time_to_first_token_seconds_bucket", le=b) for b in ("0.1", "0.25", "2.5")] == [
        0,
        1,
        2,
    ]
    assert v("request_time_per_output_token_seconds_sum") == pytest.approx(0.1)
    assert [v("request_time_per_output_token_seconds_bucket", le=b) for b in ("0.01", "0.1")] == [
        1,
        2,
    ]
    assert v("request_queue_time_seconds_sum") == pytest.approx(2.2)
    assert v("request_queue_time_seconds_bucket", le="0.3") == 1
    assert v("request_prefill_time_seconds_sum") == pytest.approx(0.55)
    assert v("request_decode_time_seconds_sum") == 3.0
    assert v("request_decode_time_seconds_bucket", le="1.0") == 1
    assert v("request_inference_time_seconds_sum") == pytest.approx(3.55)
    assert v("request_inference_time_seconds_bucket", le="1.0") == 0
    # Token counts and request parameters.
    assert v("request_prompt_tokens_sum") == 700
    assert [v("request_prompt_tokens_bucket", le=b) for b in ("100.0", "500.0", "1000.0")] == [
        1,
        1,
        2,
    ]
    assert (v("request_generation_tokens_sum"), v("request_generation_tokens_count")) == (12, 2)
    assert v("request_generation_tokens_bucket", le="1.0") == 1
    assert v("request_max_num_generation_tokens_sum") == 12
    assert (v("request_params_max_tokens_count"), v("request_params_max_tokens_sum")) == (1, 11)
    assert (v("request_params_n_count"), v("request_params_n_sum")) == (2, 3)
    assert (v("request_num_preemptions_count"), v("request_num_preemptions_sum")) == (2, 3)
    assert [v("request_num_preemptions_bucket", le=b) for b in ("1.0", "2.0", "3.0")] == [1, 1, 2]
    assert v("request_prefill_kv_computed_tokens_sum") == 188
    # Prompt tokens by where their KV came from: all cache hits are on the device.
    assert v("prompt_tokens_cached_total") == 512
    assert v("prompt_tokens_cached_by_source_total", source="device") == 512
    assert v("prompt_tokens_cached_by_source_total", source="host") == 0
    assert v("prompt_tokens_by_source_total", source="local_compute") == 188
    assert v("prompt_tokens_by_source_total", source="local_cache_hit") == 512
    assert v("prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    # Per-step counters are observe_step's business.
    assert v("prompt_tokens_total") == 0 and v("generation_tokens_total") == 0


def test_unknown_finished_reason_is_refused(metrics: VllmMetrics) -> None:
    with pytest.raises(ValueError, match="finished_reason"):
        metrics.observe_finished(
            finished_reason="done",
            prompt_tokens=1,
            generation_tokens=1,
            max_tokens=1,
            n=1,
            arrival=0,
            scheduled=0,
            first_token=0,
            finish=0,
            num_preemptions=0,
            prefill_computed_tokens=1,
            cached_prompt_tokens=0,
        )
    assert not re.search(r'finished_reason="done"', page(metrics))
