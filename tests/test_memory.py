"""Startup memory accounting of the simulated engine (autotune.sim.config_checks and
autotune.sim.memory) against vLLM 0.32.

Expected texts come from docs/vllm.md#4-startup-errors and the real vLLM 0.32 CPU captures in
``tests/data/captures``.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from autotune.errors import SimStartupError
from autotune.failures import FailureClass, classify_log
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import ModelProfile, get_model
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.config_checks import validate_config
from autotune.sim.memory import (
    activation_bytes_per_token,
    cudagraph_memory_bytes,
    estimate_max_model_len,
    kv_blocks_from_pieces,
    plan_memory,
)

GiB = 1024**3
MiB = 1024**2
CAPTURES = Path(__file__).parent / "data" / "captures"

L8B = get_model("meta-llama/Llama-3.1-8B-Instruct")
L70B = get_model("meta-llama/Llama-3.1-70B-Instruct")
L2 = get_model("meta-llama/Llama-2-7b-hf")  # max_position_embeddings 4096, like the captures
TINY = get_model("autotune/tiny-llama")
H100 = get_hardware("H100-80GB")


def resolve(model: ModelProfile = L8B, /, **kw: object) -> ResolvedArgs:
    return EngineArgs(**kw).resolve(model, H100)  # type: ignore[arg-type]


def startup_error(model: ModelProfile = L8B, /, **kw: object) -> SimStartupError:
    with pytest.raises(SimStartupError) as info:
        plan_memory(model, H100, resolve(model, **kw))
    return info.value


def capture_lines(name: str) -> list[str]:
    return (CAPTURES / name).read_text(encoding="utf-8").splitlines()


# -- kv_blocks_from_pieces: the issue #10517 worked example (docs/vllm.md#21-worked-examples) --
def test_worked_example_rounded_pieces_floor_to_1951() -> None:
    # The log's pieces are printed to 2 decimals: 21.222 - 14.99 - 2.07 - 0.35 = 3.812 GiB,
    # 3.812 GiB / 2 MiB = 1951.7 -> vLLM's floor gives 1951 from these rounded numbers.
    blocks = kv_blocks_from_pieces(23.58 * GiB, 0.9, 14.99 * GiB, 2.07 * GiB, 0.35 * GiB, 2 * MiB)
    assert blocks == 1951


def test_worked_example_logged_1952_lies_within_rounding_band() -> None:
    # Each logged piece is exact only to +-0.005 GiB; total enters scaled by util. The logged
    # 1952 blocks must be reachable from some true values inside that band.
    slack = 0.005 * GiB
    lo = kv_blocks_from_pieces(
        23.58 * GiB - slack,
        0.9,
        14.99 * GiB + slack,
        2.07 * GiB + slack,
        0.35 * GiB + slack,
        2 * MiB,
    )
    hi = kv_blocks_from_pieces(
        23.58 * GiB + slack,
        0.9,
        14.99 * GiB - slack,
        2.07 * GiB - slack,
        0.35 * GiB - slack,
        2 * MiB,
    )
    assert lo <= 1952 <= hi
    assert lo < 1951 < hi  # the band is wide: 1951 vs 1952 is rounding, not a model error


def test_worked_example_exact_logged_kv_gives_1952() -> None:
    # 1952 blocks * 2 MiB = 3.8125 GiB exactly: that much available KV must give 1952.
    assert kv_blocks_from_pieces(3.8125 * GiB, 1.0, 0, 0, 0, 2 * MiB) == 1952
    assert kv_blocks_from_pieces(3.8125 * GiB - 1, 1.0, 0, 0, 0, 2 * MiB) == 1951


def test_kv_blocks_from_pieces_is_zero_when_nothing_left() -> None:
    assert kv_blocks_from_pieces(10 * GiB, 0.5, 6 * GiB, 0, 0, 2 * MiB) == 0
    assert kv_blocks_from_pieces(10 * GiB, 0.5, 5 * GiB, 0, 0, 2 * MiB) == 0  # exactly 0 left


# -- H100 / Llama-3.1-8B V1 defaults (docs/vllm.md#21-worked-examples; derived, uncertain) ----
def test_h100_llama8b_defaults_within_5_percent() -> None:
    # docs/vllm.md#21-worked-examples: 0.9 x 79.2 - 14.99 - 0.85 - 0.5 - 0.35 - 0.4 ~= 54 GiB
    # -> ~27 600 blocks -> ~440k tokens. The reference itself is derived, so 5 % tolerance.
    plan = plan_memory(L8B, H100, resolve())
    assert plan.available_kv_bytes / GiB == pytest.approx(54, rel=0.05)
    assert plan.num_blocks == pytest.approx(27_600, rel=0.05)
    assert plan.kv_tokens == pytest.approx(440_000, rel=0.05)
    assert plan.kv_tokens == plan.num_blocks * 16
    assert plan.max_concurrency == plan.num_blocks / math.ceil(131072 / 16)
    # Pieces against that example's numbers: activation 8192 x ~0.104 MiB, sampler 1024 x V x 4 B.
    assert plan.activation_bytes / GiB == pytest.approx(0.85, rel=0.02)
    assert plan.sampler_bytes == 1024 * 128256 * 4
    assert plan.non_torch_bytes / GiB == pytest.approx(0.35)
    assert 0.3 * GiB <= plan.cudagraph_bytes <= 1.0 * GiB
    assert plan.weights_bytes == L8B.weight_bytes(1)


def test_activation_calibrated_on_issue_10517() -> None:
    per_token = activation_bytes_per_token(L8B)
    assert per_token / MiB == pytest.approx(0.104, rel=0.02)
    # Both V0 log points (20 000 tok -> 2.07 GiB, 29 000 -> 2.99 GiB) to within 0.02 GiB.
    assert 20_000 * per_token / GiB == pytest.approx(2.07, abs=0.02)
    assert 29_000 * per_token / GiB == pytest.approx(2.99, abs=0.02)


def test_success_log_lines() -> None:
    plan = plan_memory(L8B, H100, resolve())
    text = "\n".join(plan.log_lines)
    assert "Chunked prefill is enabled with max_num_batched_tokens=8192." in text
    assert re.search(r"Loading model weights took 14\.\d{4} GB$", text, re.M)
    assert re.search(r"Available KV cache memory: 54\.\d{1,2} GiB$", text, re.M)
    size = re.search(r"GPU KV cache size: ([\d,]+) tokens", text)
    assert size and int(size.group(1).replace(",", "")) == plan.kv_tokens
    conc = re.search(r"Maximum concurrency for 131,072 tokens per request: ([\d.]+)x", text)
    assert conc and float(conc.group(1)) == pytest.approx(plan.max_concurrency, abs=0.005)
    assert classify_log(plan.log_lines) is None  # a healthy startup classifies as nothing


def test_chunked_prefill_line_only_when_on() -> None:
    plan = plan_memory(
        L8B,
        H100,
        resolve(enable_chunked_prefill=False, max_model_len=8192, max_num_batched_tokens=8192),
    )
    assert not any("Chunked prefill" in line for line in plan.log_lines)


def test_eager_or_flag_off_skips_cudagraph_estimate() -> None:
    base = plan_memory(L8B, H100, resolve())
    for kw in ({"enforce_eager": True}, {"sim_estimate_cudagraph_memory": False}):
        plan = plan_memory(L8B, H100, resolve(**kw))
        assert plan.cudagraph_bytes == 0
        assert plan.available_kv_bytes == base.available_kv_bytes + base.cudagraph_bytes
        assert not any("CUDA graph" in line for line in plan.log_lines)


def test_cudagraph_grows_with_capture_sizes_and_stops_at_512() -> None:
    sizes = [cudagraph_memory_bytes(L8B, 1, mns, 8192) for mns in (1, 8, 64, 128, 256, 1024)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert sizes[-2] == sizes[-1]  # 2 x 256 = 512 = the cap
    assert cudagraph_memory_bytes(L8B, 1, 1024, 64) < sizes[-1]  # also capped by mnbt


# -- startup errors: exact text, class, classify_log round trip ------------------------------
CONFIG_CASES = [
    # (model, engine args, class, regex on the message)
    (
        L2,
        {"max_model_len": 8192, "max_num_batched_tokens": 8192},
        FailureClass.MAXLEN_GT_MODEL,
        r"User-specified max_model_len \(8192\) is greater than the derived max_model_len "
        r"\(max_position_embeddings=4096\.0 or model_max_length=None in model's config\.json\)\. "
        r"To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1\. ",
    ),
    (
        L8B,
        {"enable_chunked_prefill": False, "max_model_len": 8192, "max_num_batched_tokens": 4096},
        FailureClass.MNBT_LT_MAXLEN,
        r"^max_num_batched_tokens \(4096\) is smaller than max_model_len \(8192\)\. This "
        r"effectively "
        r"limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
        r"longer "
        r"sequences\. Please increase max_num_batched_tokens or decrease max_model_len\.$",
    ),
    (
        L8B,
        {"max_num_seqs": 64, "max_num_batched_tokens": 32},
        FailureClass.MNBT_LT_MNS,
        r"^max_num_batched_tokens \(32\) must be greater than or equal to max_num_seqs \(64\)\.$",
    ),
    (
        L8B,
        {"max_num_seqs": 0, "max_num_batched_tokens": 1024},
        FailureClass.CONFIG_INVALID,
        r"^1 validation error for SchedulerConfig\nmax_num_seqs\n  Input should be greater than or "
        r"equal to 1 \[type=greater_than_equal, input_value=0, input_type=int\]",
    ),
    (
        L8B,
        {"max_num_seqs": 1, "max_num_batched_tokens": 0},
        FailureClass.CONFIG_INVALID,
        r"^1 validation error for SchedulerConfig\nmax_num_batched_tokens\n  Input should be "
        r"greater "
        r"than or equal to 1 \[type=greater_than_equal, input_value=0, input_type=int\]",
    ),
    # mns=0 with mnbt defaulted: vLLM's defaulting makes mnbt = min(0 * mml, 8192) = 0 too.
    (
        L8B,
        {"max_num_seqs": 0},
        FailureClass.CONFIG_INVALID,
        r"^2 validation errors for SchedulerConfig\nmax_num_batched_tokens\n.*\n.*\nmax_num_seqs\n",
    ),
    (
        L8B,
        {"gpu_memory_utilization": 1.5},
        FailureClass.CONFIG_INVALID,
        r"^1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be less "
        r"than or "
        r"equal to 1 \[type=less_than_equal, input_value=1\.5, input_type=float\]",
    ),
    (
        L8B,
        {"gpu_memory_utilization": 0.0},
        FailureClass.CONFIG_INVALID,
        r"^1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be greater "
        r"than 0 \[type=greater_than, input_value=0\.0, input_type=float\]",
    ),
    (
        L8B,
        {"tensor_parallel_size": 3},
        FailureClass.CONFIG_INVALID,
        r"^Total number of attention heads \(32\) must be divisible by tensor parallel size "
        r"\(3\)\.$",
    ),
]


@pytest.mark.parametrize(("model", "kw", "cls", "pattern"), CONFIG_CASES)
def test_config_errors(
    model: ModelProfile, kw: dict[str, object], cls: FailureClass, pattern: str
) -> None:
    err = startup_error(model, **kw)
    assert err.failure_class is cls
    assert re.search(pattern, str(err)), str(err)
    # The log looks like vLLM's: pydantic's ValidationError line, then its body.
    assert any(
        line.startswith("pydantic_core._pydantic_core.ValidationError: ") for line in err.log_lines
    )
    match = classify_log(err.log_lines)
    assert match is not None and match.failure_class is cls
    with pytest.raises(SimStartupError):  # validate_config alone raises the same
        validate_config(model, resolve(model, **kw))


def test_value_error_lines_have_pydantic_shape() -> None:
    err = startup_error(L8B, max_num_seqs=64, max_num_batched_tokens=32)
    assert err.log_lines[-3] == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig"
    )
    assert re.fullmatch(
        r"  Value error, .+ \[type=value_error, input_value=ArgsKwargs\(\(\), "
        r"\{.{9}\.\.\..{24}, input_type=ArgsKwargs\]",
        err.log_lines[-2],
    )
    assert err.log_lines[-1].endswith("https://errors.pydantic.dev/2.14/v/value_error")


def test_validation_order_follows_create_engine_config() -> None:
    # ModelConfig is built before CacheConfig, which is built before SchedulerConfig.
    err = startup_error(
        L2,
        max_model_len=8192,
        max_num_seqs=64,
        max_num_batched_tokens=32,
        gpu_memory_utilization=2.0,
    )
    assert err.failure_class is FailureClass.MAXLEN_GT_MODEL
    err = startup_error(L8B, max_num_seqs=0, gpu_memory_utilization=2.0)
    assert "for CacheConfig" in str(err)
    # Within SchedulerConfig the field bounds come first, then mnbt vs max_model_len, then mns.
    err = startup_error(
        L8B,
        enable_chunked_prefill=False,
        max_model_len=8192,
        max_num_batched_tokens=32,
        max_num_seqs=64,
    )
    assert err.failure_class is FailureClass.MNBT_LT_MAXLEN
    err = startup_error(L8B, max_num_seqs=64, max_num_batched_tokens=32, tensor_parallel_size=3)
    assert err.failure_class is FailureClass.MNBT_LT_MNS


FREE_RE = (
    r"^Free memory on device cuda:0 \(59\.2/79\.2 GiB\) on startup is less than desired "
    r"GPU memory utilization \(0\.9, 71\.28 GiB\)\. Decrease GPU memory utilization or "
    r"reduce GPU memory used by other processes\.$"
)
NO_KV_RE = (
    r"^No available memory for the cache blocks\. Try increasing `gpu_memory_utilization` "
    r"when initializing the engine\. See https://docs\.vllm\.ai/en/latest/configuration/"
    r"conserving_memory/ for more details\.$"
)
KV_RE = (
    r"^To serve at least one request with the model's max seq len \(131072\), \(16\.0 GiB KV "
    r"cache is needed, which is larger than the available KV cache memory \(0\.5 GiB\)\. "
    r"Based on the available memory, the estimated maximum model length is 4080\. Try "
    r"increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
    r"the engine\. See https://docs\.vllm\.ai/en/latest/configuration/conserving_memory/ "
    r"for more details\.$"
)


@pytest.mark.parametrize(
    ("kw", "cls", "pattern"),
    [
        ({"sim_other_tenant_bytes": 20 * GiB}, FailureClass.FREE_MEMORY, FREE_RE),
        ({"gpu_memory_utilization": 0.2}, FailureClass.NO_KV_MEMORY, NO_KV_RE),
        ({"kv_cache_memory_bytes": GiB // 2}, FailureClass.KV_TOO_SMALL, KV_RE),
    ],
)
def test_memory_errors(kw: dict[str, object], cls: FailureClass, pattern: str) -> None:
    err = startup_error(L8B, **kw)
    assert err.failure_class is cls
    assert re.search(pattern, str(err)), str(err)
    # vLLM's shape: root cause in an EngineCore ERROR line, the API server's wrapper last.
    assert err.log_lines[-2] == f"(EngineCore pid=2) ERROR [core.py:1510] ValueError: {err}"
    assert err.log_lines[-1] == (
        "RuntimeError: Engine core initialization failed. See root "
        "cause above. Failed core proc(s): {'EngineCore': 1}"
    )
    match = classify_log(err.log_lines)
    assert match is not None and match.failure_class is cls
    if cls is FailureClass.KV_TOO_SMALL:
        assert match.estimated_max_model_len == 4080  # 255 usable blocks (one is the null)


def test_kv_too_small_formats_gib_like_vllm() -> None:
    # vLLM 0.32 prints round(x, 2) without padding: tiny sizes read "0.0 GiB" (see capture c).
    err = startup_error(
        TINY,
        max_model_len=1024,
        max_num_batched_tokens=1024,
        max_num_seqs=16,
        block_size=128,
        kv_cache_memory_bytes=262144,
    )
    assert "(0.0 GiB KV cache is needed" in str(err) and "memory (0.0 GiB)" in str(err)


def test_kv_too_small_omits_estimate_when_not_one_token_fits() -> None:
    block = TINY.page_bytes_per_layer(16) * TINY.num_layers
    err = startup_error(TINY, max_model_len=64, kv_cache_memory_bytes=block - 1)
    assert err.failure_class is FailureClass.KV_TOO_SMALL
    assert "estimated maximum model length" not in str(err)
    assert "GiB). Try increasing" in str(err)


def test_free_memory_check_still_runs_with_kv_cache_memory_bytes() -> None:
    # gpu_worker.init_device calls request_memory() unconditionally; only profiling is skipped.
    err = startup_error(L8B, kv_cache_memory_bytes=10 * GiB, sim_other_tenant_bytes=20 * GiB)
    assert err.failure_class is FailureClass.FREE_MEMORY


# -- simulated vs real captured logs ---------------------------------------------------------
def _value_error_text(line: str) -> str:
    return line.split("Value error, ", 1)[1].split(" [type=value_error", 1)[0]


def test_same_text_and_class_as_capture_mnbt_lt_maxlen() -> None:
    real = capture_lines("bad_a_mnbt_lt_mml.log")
    err = startup_error(
        TINY,
        enable_chunked_prefill=False,
        max_model_len=1024,
        max_num_batched_tokens=512,
        max_num_seqs=16,
    )
    real_value = next(line for line in real if "Value error, " in line)
    assert str(err) == _value_error_text(real_value)
    assert err.log_lines[-2] == real_value  # input_value included: same truncated ArgsKwargs
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match and sim_match
    assert real_match.failure_class is sim_match.failure_class is FailureClass.MNBT_LT_MAXLEN


def test_same_text_and_class_as_capture_maxlen_gt_model() -> None:
    real = capture_lines("bad_b_mml_gt_maxpos.log")
    err = startup_error(TINY, max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=16)
    assert str(err) == _value_error_text(next(line for line in real if "Value error, " in line))
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match and sim_match
    assert real_match.failure_class is sim_match.failure_class is FailureClass.MAXLEN_GT_MODEL


def test_same_lines_and_class_as_capture_mns_0() -> None:
    real = capture_lines("bad_d_mns_0.log")
    err = startup_error(TINY, max_model_len=1024, max_num_batched_tokens=1024, max_num_seqs=0)
    assert list(err.log_lines[1:]) == real[-4:]  # ValidationError, field, text, URL lines
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match and sim_match
    assert real_match.failure_class is sim_match.failure_class is FailureClass.CONFIG_INVALID


def test_same_class_as_capture_kv_too_small() -> None:
    real = capture_lines("bad_c_kvbytes_512tok.log")
    err = startup_error(
        TINY,
        max_model_len=1024,
        max_num_batched_tokens=1024,
        max_num_seqs=16,
        block_size=128,
        kv_cache_memory_bytes=262144,
    )
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match and sim_match
    assert real_match.failure_class is sim_match.failure_class is FailureClass.KV_TOO_SMALL
    # Same text but for the CPU backend's parenthesis (we emit GPU wording). 256 KiB holds 4
    # blocks of 2 x 32 KiB; vLLM 0.32 holds one back (the null block), so 3 blocks of 128
    # tokens: 384, as the real run said.
    assert sim_match.estimated_max_model_len == real_match.estimated_max_model_len == 384
    real_text = real_match.line.split("ValueError: ", 1)[1]
    expected = real_text.replace(" (which also controls CPU memory on the CPU backend)", "")
    assert str(err) == expected


def test_same_class_as_capture_no_kv_memory() -> None:
    real = capture_lines("bad_c_kvspace_0.log")
    # The capture set VLLM_CPU_KVCACHE_SPACE=0 (CPU only; on the GPU worker 0 means "unset").
    # The GPU analogue: weights + activations above util x total (8B at 0.2 of an H100).
    err = startup_error(L8B, gpu_memory_utilization=0.2)
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match and sim_match
    assert real_match.failure_class is sim_match.failure_class is FailureClass.NO_KV_MEMORY


# -- kv_cache_memory_bytes, TP, 70B ----------------------------------------------------------
def test_kv_cache_memory_bytes_bypasses_utilization() -> None:
    plans = [
        plan_memory(L8B, H100, resolve(gpu_memory_utilization=u, kv_cache_memory_bytes=20 * GiB))
        for u in (0.3, 0.9)
    ]
    for plan in plans:
        assert plan.available_kv_bytes == 20 * GiB
        assert plan.num_blocks == 20 * GiB // (2 * MiB)
        assert plan.cudagraph_bytes == 0
        assert any(
            "reserved 20.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes" in line
            for line in plan.log_lines
        )
    # Without the override the two utilizations give different, profiled sizes.
    profiled = [
        plan_memory(L8B, H100, resolve(gpu_memory_utilization=u, max_model_len=8192))
        for u in (0.3, 0.9)
    ]
    assert profiled[0].num_blocks < profiled[1].num_blocks


def test_kv_cache_memory_bytes_zero_means_unset() -> None:
    # gpu_worker: `if kv_cache_memory_bytes := ...` -> 0 is falsy and profiling runs.
    assert plan_memory(L8B, H100, resolve(kv_cache_memory_bytes=0)) == plan_memory(
        L8B, H100, resolve()
    )


def test_tp2_halves_weights_and_kv_heads() -> None:
    one = plan_memory(L8B, H100, resolve())
    two = plan_memory(L8B, H100, resolve(tensor_parallel_size=2))
    assert two.weights_bytes == one.weights_bytes // 2
    assert L8B.page_bytes_per_layer(16, 2) * 2 == L8B.page_bytes_per_layer(16, 1)
    assert two.non_torch_bytes == int(0.6 * GiB)
    assert two.sampler_bytes == one.sampler_bytes  # full-vocab logits on every rank
    assert two.num_blocks > 2 * one.num_blocks  # half the bytes per block, more room


def test_70b_needs_more_than_one_h100() -> None:
    err = startup_error(L70B)
    assert err.failure_class is FailureClass.NO_KV_MEMORY
    plan = plan_memory(L70B, H100, resolve(L70B, tensor_parallel_size=4))
    assert plan.weights_bytes == L70B.weight_bytes(4)
    assert plan.num_blocks >= math.ceil(131072 / 16)  # one full-length request fits


# -- properties ------------------------------------------------------------------------------
@given(
    available=st.integers(-10, 10**7),
    block_bytes=st.integers(1, 10**5),
    block_size=st.sampled_from([1, 8, 16, 32, 128]),
    max_len=st.integers(1, 10**5),
)
def test_estimate_is_largest_fitting_length(
    available: int, block_bytes: int, block_size: int, max_len: int
) -> None:
    def fits(n: int) -> bool:
        return math.ceil(n / block_size) * block_bytes <= available

    est = estimate_max_model_len(available, block_bytes, block_size, max_len)
    if est == 0:
        assert not fits(1)
    else:
        assert 1 <= est <= max_len and fits(est)
        assert est == max_len or not fits(est + 1)
        assert est == min(max_len, max(0, available) // block_bytes * block_size)


@given(mml=st.integers(1, 131072), kv_mib=st.integers(1, 4096))
def test_kv_too_small_estimate_is_largest_fitting(mml: int, kv_mib: int) -> None:
    args = resolve(max_model_len=mml, kv_cache_memory_bytes=kv_mib * MiB)
    try:
        plan = plan_memory(L8B, H100, args)
    except SimStartupError as err:
        assert err.failure_class is FailureClass.KV_TOO_SMALL
        match = classify_log(err.log_lines)
        assert match is not None
        est = match.estimated_max_model_len
        if est is None:  # vLLM omits the estimate when not even one block fits
            # (beside the null block it holds back)
            assert kv_mib * MiB < 2 * L8B.page_bytes_per_layer(16) * L8B.num_layers
            return
        # The estimate fits, one more token does not, and it is below the requested length.
        assert est < mml
        assert plan_memory(L8B, H100, replace(args, max_model_len=est)).num_blocks > 0
        with pytest.raises(SimStartupError):
            plan_memory(L8B, H100, replace(args, max_model_len=est + 1))
    else:
        assert plan.num_blocks * 16 >= mml


def _blocks(args: ResolvedArgs) -> int | None:
    """num_blocks, 0 for a memory/KV failure, None for a config the search space would bar."""
    try:
        return plan_memory(L8B, H100, args).num_blocks
    except SimStartupError as err:
        if err.failure_class in (FailureClass.NO_KV_MEMORY, FailureClass.KV_TOO_SMALL):
            return 0
        return None


@given(
    u1=st.floats(0.05, 1.0),
    u2=st.floats(0.05, 1.0),
    mns=st.integers(1, 2048),
    mnbt=st.integers(1, 65536),
)
def test_more_utilization_never_fewer_blocks(u1: float, u2: float, mns: int, mnbt: int) -> None:
    assume(mnbt >= mns)
    lo, hi = sorted((u1, u2))
    kw = {"max_model_len": 4096, "max_num_seqs": mns, "max_num_batched_tokens": mnbt}
    b_lo = _blocks(resolve(gpu_memory_utilization=lo, **kw))
    b_hi = _blocks(resolve(gpu_memory_utilization=hi, **kw))
    assert b_lo is not None and b_hi is not None and b_lo <= b_hi


@given(
    mns=st.integers(1, 2048),
    mns_up=st.integers(0, 2048),
    mnbt=st.integers(1, 65536),
    mnbt_up=st.integers(0, 65536),
    util=st.floats(0.3, 1.0),
)
def test_more_seqs_or_tokens_never_more_blocks(
    mns: int, mns_up: int, mnbt: int, mnbt_up: int, util: float
) -> None:
    def blocks(s: int, t: int) -> int | None:
        return _blocks(
            resolve(
                gpu_memory_utilization=util,
                max_model_len=4096,
                max_num_seqs=s,
                max_num_batched_tokens=t,
            )
        )

    base, more_seqs, more_tokens = (
        blocks(mns, mnbt),
        blocks(mns + mns_up, mnbt),
        blocks(mns, mnbt + mnbt_up),
    )
    assume(base is not None)
    assert base is not None
    if more_seqs is not None:
        assert more_seqs <= base
    if more_tokens is not None:
        assert more_tokens <= base
