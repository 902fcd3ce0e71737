"""What vLLM 0.32's ``/metrics`` page holds besides values: histogram buckets, label values
and ``vllm:cache_config_info``'s label set, copied from a real page
(``tests/data/captures/metrics_after.txt``; docs/vllm.md#6-prometheus-metrics).

The fixed bucket bounds come from ``vllm/v1/metrics/loggers.py``, confirmed identical on the
0.32 page (docs/vllm.md#63-histogram-buckets); token-count histograms use
:func:`build_1_2_5_buckets` up to ``max_model_len``. The simulated page
(:mod:`autotune.sim.exposition`) and the telemetry the in-process replay derives
(:mod:`autotune.sim.adapters`) share them.
"""

from __future__ import annotations

__all__ = [
    "ADMISSION_REASONS",
    "CACHED_SOURCES",
    "CACHE_CONFIG_DEFAULTS",
    "FINISHED_REASONS",
    "ITERATION_TOKENS_BUCKETS",
    "ITL_BUCKETS",
    "N_BUCKETS",
    "PREEMPTION_BUCKETS",
    "PROMPT_SOURCES",
    "REQUEST_LATENCY_BUCKETS",
    "SLEEP_STATES",
    "TTFT_BUCKETS",
    "WAITING_REASONS",
    "build_1_2_5_buckets",
]

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

# vllm:cache_config_info's full label set with the values of the captured page (CPU backend,
# 1 GiB KV space); callers override what the simulated config determines.
CACHE_CONFIG_DEFAULTS: dict[str, str] = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "2048.0",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "2097152",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "16384",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    buckets: list[int] = []
    exponent = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent *= 10
