"""Hardware and model profiles, vLLM's batch defaults and EngineArgs.resolve
(docs/vllm.md#11-batch-defaults-per-gpu-class)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.errors import ProfileError
from autotune.profiles.hardware import GiB, builtin_hardware, get_hardware
from autotune.profiles.models import builtin_models, get_model, load_model_config
from autotune.sim.args import EngineArgs

KiB = 1024
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA2_7B = "meta-llama/Llama-2-7b-hf"

# -- models -------------------------------------------------------------------------------


def test_llama_3_1_8b() -> None:
    m = get_model(LLAMA_8B)
    assert m.num_params == pytest.approx(8.03e9, rel=2e-3)
    # vLLM logs "Loading model weights took 14.9888 GB" (GiB, plus a few buffers).
    assert m.weight_bytes() / GiB == pytest.approx(14.96, abs=0.01)
    assert m.kv_bytes_per_token() == 128 * KiB


def test_qwen_2_5_7b() -> None:
    m = get_model(QWEN_7B)
    assert m.num_params == pytest.approx(7.62e9, rel=2e-3)
    assert m.kv_bytes_per_token() == 56 * KiB


def test_llama_2_7b_has_no_gqa() -> None:
    assert get_model(LLAMA2_7B).kv_bytes_per_token() == 512 * KiB


def test_llama_70b() -> None:
    m = get_model(LLAMA_70B)
    assert m.kv_bytes_per_token() == 320 * KiB
    assert m.weight_bytes() / GiB == pytest.approx(131.4, abs=0.1)


def test_tensor_parallel_halves_weights_and_kv() -> None:
    m = get_model(LLAMA_8B)
    assert m.weight_bytes(tp=2) == m.weight_bytes() // 2
    assert m.kv_bytes_per_token(tp=2) == m.kv_bytes_per_token() // 2
    assert m.page_bytes_per_layer(16, tp=2) == m.page_bytes_per_layer(16) // 2


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    m = get_model(QWEN_7B)  # 4 KV heads
    assert m.kv_heads_per_rank(4) == 1
    assert m.kv_heads_per_rank(8) == 1  # replicated, not 0.5 per rank
    assert m.kv_bytes_per_token(8) == m.kv_bytes_per_token(4) == 14 * KiB


def test_builtin_model_names_are_unique_case_insensitively() -> None:
    names = [m.name.lower() for m in builtin_models()]
    assert len(names) == len(set(names))


def test_get_model_ignores_case() -> None:
    assert get_model(LLAMA_8B.upper()) is get_model(LLAMA_8B)


def test_get_model_unknown_lists_known_names() -> None:
    with pytest.raises(ProfileError, match="no-such/model") as info:
        get_model("no-such/model")
    assert LLAMA_8B in str(info.value)
    assert QWEN_7B in str(info.value)


# -- hardware -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("H100-80GB", (1024, 8192)),
        ("H200", (1024, 8192)),
        # vLLM keeps A100-80GB in the small row on purpose (PR #17885).
        ("A100-80GB", (256, 2048)),
        ("A100-40GB", (256, 2048)),
        ("L40S", (256, 2048)),
        ("test-4GB", (256, 2048)),
    ],
)
def test_vllm_server_defaults(name: str, expected: tuple[int, int]) -> None:
    assert get_hardware(name).vllm_server_defaults() == expected


def test_reported_memory_is_below_marketing_number() -> None:
    assert get_hardware("H100-80GB").memory_gib < 80
    assert get_hardware("A100-80GB").memory_gib < 80


def test_get_hardware_ignores_case() -> None:
    assert get_hardware("h100-80gb") is get_hardware("H100-80GB")


def test_get_hardware_unknown_lists_known_names() -> None:
    with pytest.raises(ProfileError, match="'B200'") as info:
        get_hardware("B200")
    for h in builtin_hardware():
        assert h.name in str(info.value)


# -- EngineArgs.resolve (docs/vllm.md#11-batch-defaults-per-gpu-class) ---------------------

H100 = get_hardware("H100-80GB")
A100 = get_hardware("A100-80GB")


def test_resolve_defaults_on_h100() -> None:
    m = get_model(LLAMA_8B)
    r = EngineArgs().resolve(m, H100)
    assert r.max_model_len == m.max_position_embeddings == 131072
    assert (r.max_num_seqs, r.max_num_batched_tokens) == (1024, 8192)
    assert r.gpu_memory_utilization == 0.9
    assert r.enable_chunked_prefill and r.enable_prefix_caching


def test_resolve_chunked_prefill_off_raises_mnbt_to_max_model_len() -> None:
    m = get_model(LLAMA_8B)
    r = EngineArgs(enable_chunked_prefill=False).resolve(m, H100)
    assert r.max_num_batched_tokens == 131072
    r = EngineArgs(enable_chunked_prefill=False, max_model_len=4096).resolve(m, A100)
    assert r.max_num_batched_tokens == 4096  # max(4096, 2048)
    r = EngineArgs(enable_chunked_prefill=False, max_model_len=1024).resolve(m, A100)
    assert r.max_num_batched_tokens == 2048  # the default wins when larger


def test_resolve_caps_mnbt_at_mns_times_max_model_len() -> None:
    m = get_model(LLAMA_8B)
    r = EngineArgs(max_model_len=64, max_num_seqs=4).resolve(m, H100)
    assert r.max_num_batched_tokens == 256


def test_resolve_caps_defaulted_mns_at_mnbt() -> None:
    m = get_model(LLAMA_8B)
    r = EngineArgs(max_num_batched_tokens=512).resolve(m, H100)
    assert r.max_num_seqs == 512


def test_resolve_leaves_user_values_alone_even_invalid_ones() -> None:
    # Validation (and vLLM's error text) happens later, in autotune.sim.config_checks.
    m = get_model(LLAMA_8B)
    r = EngineArgs(
        max_model_len=8192,
        max_num_seqs=2048,
        max_num_batched_tokens=100,
        enable_chunked_prefill=False,
    ).resolve(m, H100)
    assert (r.max_model_len, r.max_num_seqs, r.max_num_batched_tokens) == (8192, 2048, 100)
    r = EngineArgs(max_num_seqs=0).resolve(m, H100)
    assert r.max_num_seqs == 0


@given(
    mml=st.none() | st.integers(1, 131072),
    mns=st.none() | st.integers(1, 4096),
    mnbt=st.none() | st.integers(1, 262144),
    chunked=st.booleans(),
    hw=st.sampled_from(builtin_hardware()),
)
def test_resolve_rules_hold(
    mml: int | None, mns: int | None, mnbt: int | None, chunked: bool, hw: Any
) -> None:
    m = get_model(LLAMA_8B)
    r = EngineArgs(
        max_model_len=mml,
        max_num_seqs=mns,
        max_num_batched_tokens=mnbt,
        enable_chunked_prefill=chunked,
    ).resolve(m, hw)
    d_mns, d_mnbt = hw.vllm_server_defaults()
    assert r.max_model_len == (mml if mml is not None else m.max_position_embeddings)
    if mns is not None:
        assert r.max_num_seqs == mns
    if mnbt is not None:
        assert r.max_num_batched_tokens == mnbt
    else:
        base = d_mnbt if chunked else max(r.max_model_len, d_mnbt)
        want_mns = mns if mns is not None else d_mns
        assert r.max_num_batched_tokens == min(base, want_mns * r.max_model_len)
    if mns is None:
        assert r.max_num_seqs == min(d_mns, r.max_num_batched_tokens)


# -- load_model_config --------------------------------------------------------------------

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _write(folder: Path, cfg: dict[str, Any] | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg, indent=2), encoding="utf-8")
    return path


def test_load_config_matches_builtin(tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    _write(folder, LLAMA_CONFIG)
    m = load_model_config(folder)
    ref = get_model(LLAMA_8B)
    assert m.name == str(folder)
    assert m.num_params == ref.num_params
    assert m.kv_bytes_per_token() == ref.kv_bytes_per_token()
    assert m.max_position_embeddings == 131072


def test_load_config_file_or_folder(tmp_path: Path) -> None:
    path = _write(tmp_path / "m", LLAMA_CONFIG)
    assert load_model_config(path) == load_model_config(path.parent)
    assert get_model(str(path.parent)) == load_model_config(path.parent)
    assert load_model_config(path, name="mine").name == "mine"


def test_load_config_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad", '{\n  "hidden_size": 4096,\n  oops\n}\n')
    with pytest.raises(ProfileError) as info:
        load_model_config(path)
    assert f"{path}:3:" in str(info.value)
    assert "malformed JSON" in str(info.value)


def test_load_config_not_an_object(tmp_path: Path) -> None:
    path = _write(tmp_path / "list", "[1, 2]")
    with pytest.raises(ProfileError, match="JSON object"):
        load_model_config(path)


@pytest.mark.parametrize(
    "field", ["num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings"]
)
def test_load_config_missing_field_is_named(tmp_path: Path, field: str) -> None:
    path = _write(tmp_path / "m", {k: v for k, v in LLAMA_CONFIG.items() if k != field})
    with pytest.raises(ProfileError, match=f"'{field}'") as info:
        load_model_config(path)
    assert str(path) in str(info.value)


def test_load_config_bad_field_value(tmp_path: Path) -> None:
    path = _write(tmp_path / "m", {**LLAMA_CONFIG, "num_hidden_layers": "32"})
    with pytest.raises(ProfileError, match="'num_hidden_layers' must be a positive integer"):
        load_model_config(path)


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read model config"):
        load_model_config(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match=r"config\.json"):
        load_model_config(tmp_path / "empty")
