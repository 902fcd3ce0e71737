"""autotune.failures: classify_log / parse_estimated_max_len on real vLLM 0.32 logs and on the
vLLM texts quoted in docs/vllm.md#4-startup-errors (all wordings: V0, early/mid/late V1, 0.32,
third-party)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.failures import FailureClass, classify_log, parse_estimated_max_len

CAPTURES = Path(__file__).parent / "data" / "captures"

DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def capture(name: str) -> list[str]:
    return (CAPTURES / name).read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("name", "cls", "estimate"),
    [
        ("bad_a_mnbt_lt_mml.log", FailureClass.MNBT_LT_MAXLEN, None),
        ("bad_b_mml_gt_maxpos.log", FailureClass.MAXLEN_GT_MODEL, None),
        ("bad_c_kvbytes_512tok.log", FailureClass.KV_TOO_SMALL, 384),
        ("bad_c_kvspace_0.log", FailureClass.NO_KV_MEMORY, None),
        ("bad_d_mns_0.log", FailureClass.CONFIG_INVALID, None),
    ],
)
def test_real_captures(name: str, cls: FailureClass, estimate: int | None) -> None:
    match = classify_log(capture(name))
    assert match is not None
    assert match.failure_class is cls
    assert match.estimated_max_model_len == estimate
    assert match.line == match.line.strip()


def test_real_healthy_startup_is_not_a_failure() -> None:
    assert classify_log(capture("serve8_precedence.log")) is None


def test_root_cause_wins_over_engine_wrapper_in_real_log() -> None:
    # The KV error sits above "Engine core initialization failed" and a pydantic-free traceback.
    lines = capture("bad_c_kvbytes_512tok.log")
    wrapper = next(i for i, line in enumerate(lines) if "Engine core initialization failed" in line)
    root = next(i for i, line in enumerate(lines) if "To serve at least one request" in line)
    assert root < wrapper
    assert classify_log(lines[root : wrapper + 1]) == classify_log(lines)


# Lines quoted in docs/vllm.md#42-kv-cache-errors (exact wording per version), with their
# class and estimate.
V1_EARLY = (
    "To serve at least one request with the models's max seq len (32768), (4.00 GB KV "
    "cache is needed, which is larger than the available KV cache memory (2.50 GB). Try "
    "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
    "the engine."
)
V1_LATE = (
    "To serve at least one request with the models's max seq len (16384), (3.0 GiB KV cache "
    "is needed, which is larger than the available KV cache memory (1.87 GiB). Based on the "
    "available memory, the estimated maximum model length is 10224. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. "
    f"{DOCS}"
)
V1_032 = (
    "ValueError: To serve at least one request with the model's max seq len (1024), (0.0 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based "
    "on the available memory, the estimated maximum model length is 384. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
    f"decreasing `max_model_len` when initializing the engine. {DOCS}"
)
THIRD_PARTY = (
    "To serve at least one request with the model's max seq len (262144), 9.29 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (9.28 GiB). "
    "Based on the available memory, the estimated maximum model length is 260800."
)
V0 = (
    "The model's max seq len (29000) is larger than the maximum number of tokens that can be "
    "stored in KV cache (23648). Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine."
)


@pytest.mark.parametrize(
    ("line", "cls", "estimate"),
    [
        (
            "Free memory on device (12.18/23.56 GiB) on startup is less than desired GPU memory "
            "utilization (0.92, 21.67 GiB). Decrease GPU memory utilization or reduce GPU memory "
            "used by "
            "other processes.",
            FailureClass.FREE_MEMORY,
            None,
        ),
        (
            "ValueError: Free memory on device cuda:0 (52.81/95.01 GiB) on startup is less than "
            "desired "
            "GPU memory utilization (0.9, 85.51 GiB). Decrease GPU memory utilization or reduce "
            "GPU "
            "memory used by other processes.",
            FailureClass.FREE_MEMORY,
            None,
        ),
        (
            "ValueError: Available memory on node 0 (7.32/8.71 GiB) on startup is less than "
            "desired CPU "
            "memory utilization (0.92, 8.02 GiB). On the CPU backend, the "
            "`--gpu-memory-utilization` flag "
            "controls the fraction of CPU memory reserved (despite its name).",
            FailureClass.FREE_MEMORY,
            None,
        ),
        (
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when "
            "initializing the engine.",
            FailureClass.NO_KV_MEMORY,
            None,
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
            "memory "
            f"reservation on the CPU backend, despite its name). {DOCS}",
            FailureClass.NO_KV_MEMORY,
            None,
        ),
        (V1_EARLY, FailureClass.KV_TOO_SMALL, None),
        (V1_LATE, FailureClass.KV_TOO_SMALL, 10224),  # the "models's" typo variant
        (V1_032, FailureClass.KV_TOO_SMALL, 384),
        (THIRD_PARTY, FailureClass.KV_TOO_SMALL, 260800),  # no "(" before the GiB figure
        # KV_TOO_SMALL's V0 text in docs/vllm.md#44-failure-classes-and-matching-rules
        (V0, FailureClass.KV_TOO_SMALL, 23648),
        (
            "  Value error, max_num_batched_tokens (512) is smaller than max_model_len (1024). "
            "This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and makes "
            "vLLM "
            "reject longer sequences. Please increase max_num_batched_tokens or decrease "
            "max_model_len.",
            FailureClass.MNBT_LT_MAXLEN,
            None,
        ),
        (
            "max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64).",
            FailureClass.MNBT_LT_MNS,
            None,
        ),
        (
            "User-specified max_model_len (8192) is greater than the derived max_model_len "
            "(max_position_embeddings=4096.0 or model_max_length=None in model's config.json).",
            FailureClass.MAXLEN_GT_MODEL,
            None,
        ),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
            FailureClass.CONFIG_INVALID,
            None,
        ),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            FailureClass.CONFIG_INVALID,
            None,
        ),
        (
            "pydantic_core._pydantic_core.ValidationError: 2 validation errors for SchedulerConfig",
            FailureClass.CONFIG_INVALID,
            None,
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            FailureClass.RUNTIME_OOM,
            None,
        ),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            FailureClass.ENGINE_DEAD,
            None,
        ),
        ("OSError: [Errno 98] Address already in use", FailureClass.PORT_IN_USE, None),
    ],
)
def test_reference_lines(line: str, cls: FailureClass, estimate: int | None) -> None:
    match = classify_log([line])
    assert match is not None
    assert match.failure_class is cls
    assert match.estimated_max_model_len == estimate


@pytest.mark.parametrize(
    ("text", "estimate"),
    [
        (V1_LATE, 10224),
        (V1_032, 384),
        (THIRD_PARTY, 260800),
        (V0, 23648),
        (V1_EARLY, None),
        ("Chunked prefill is enabled with max_num_batched_tokens=8192.", None),
        ("", None),
    ],
)
def test_parse_estimated_max_len(text: str, estimate: int | None) -> None:
    assert parse_estimated_max_len(text) == estimate


def test_specific_root_cause_beats_pydantic_wrapper() -> None:
    lines = [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
        "  Value error, max_num_batched_tokens (32) must be greater than or equal to "
        "max_num_seqs (64). [type=value_error, input_value=..., input_type=ArgsKwargs]",
    ]
    match = classify_log(lines)
    assert match is not None and match.failure_class is FailureClass.MNBT_LT_MNS


def test_wrapper_alone_and_noise_are_not_classified() -> None:
    assert classify_log([]) is None
    assert (
        classify_log(
            [
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {'EngineCore': 1}"
            ]
        )
        is None
    )
    assert (
        classify_log(
            ["INFO Available KV cache memory: 3.81 GiB", "GPU KV cache size: 31,232 tokens"]
        )
        is None
    )
