"""Model profiles: architecture numbers from a Hugging Face ``config.json`` or a built-in table.

Derived quantities follow docs/simulator.md#6-model-constants: parameters per layer (QKV, O,
gated MLP), weight bytes, KV bytes per token ``2 * L * n_kv * head_dim * dtype``; tensor
parallelism divides weights and KV heads the way vLLM shards them (KV heads are replicated
when ``tp > n_kv``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.errors import ProfileError
from autotune.inputs import special_file

__all__ = ["ModelProfile", "builtin_models", "get_model", "load_model_config"]

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
}

# vLLM's _get_and_verify_max_len reads the smallest of these keys when present.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


@dataclass(frozen=True)
class ModelProfile:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    qkv_bias: bool = False
    source: str = "built-in"

    # -- derived -------------------------------------------------------------------
    @property
    def params_per_layer(self) -> int:
        """QKV + O + gated MLP weights of one decoder layer (P_layer in
        docs/simulator.md#31-formula)."""
        h, hd = self.hidden_size, self.head_dim
        qkv = h * hd * (self.num_heads + 2 * self.num_kv_heads)
        o = self.num_heads * hd * h
        mlp = 3 * h * self.intermediate_size
        bias = (self.num_heads + 2 * self.num_kv_heads) * hd if self.qkv_bias else 0
        return qkv + o + mlp + bias

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else emb
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return emb + lm_head + self.num_layers * self.params_per_layer + norms

    def weight_bytes(self, tp: int = 1) -> int:
        """Weights one TP rank holds (vLLM shards every linear layer and the vocab)."""
        return self.num_params * self.dtype_bytes // tp

    def tp_error(self, tp: int) -> str | None:
        """Why vLLM refuses tensor parallelism ``tp`` for this model (None: it accepts it):
        attention heads are split evenly across the ranks, and KV heads too, or, when there
        are fewer KV heads than ranks, each is replicated on a whole number of ranks
        (docs/sizing.md#2-tensor-parallel-candidates)."""
        if tp < 1 or self.num_heads % tp:
            return (
                f"Total number of attention heads ({self.num_heads}) must be divisible by "
                f"tensor parallel size ({tp})."
            )
        kv = self.num_kv_heads
        if (kv % tp) if tp <= kv else (tp % kv):
            return (
                f"Total number of key/value heads ({kv}) and tensor parallel size ({tp}) "
                "must divide one another."
            )
        return None

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV bytes one token occupies on one TP rank, all layers."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes

    def page_bytes_per_layer(self, block_size: int, tp: int = 1) -> int:
        """``FullAttentionSpec.page_size_bytes``: one block of one layer."""
        return 2 * block_size * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes

    def with_name(self, name: str) -> ModelProfile:
        return replace(self, name=name)


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    max_pos: int,
    tie: bool = False,
    bias: bool = False,
) -> ModelProfile:
    return ModelProfile(
        name,
        layers,
        hidden,
        heads,
        kv,
        hidden // heads,
        inter,
        vocab,
        max_pos,
        tie_word_embeddings=tie,
        qkv_bias=bias,
    )


# Architecture numbers from the models' public config.json files (the first four as in
# docs/simulator.md#6-model-constants; the rest from their published configs).
_BUILTIN: tuple[ModelProfile, ...] = (
    _llama("meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 14336, 128256, 131072),
    _llama("meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 131072),
    _llama("meta-llama/Meta-Llama-3-8B-Instruct", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("meta-llama/Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 28672, 128256, 131072),
    _llama("meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("meta-llama/Llama-3.2-1B-Instruct", 16, 2048, 32, 8, 8192, 128256, 131072, tie=True),
    _llama("meta-llama/Llama-3.2-3B-Instruct", 28, 3072, 24, 8, 8192, 128256, 131072, tie=True),
    _llama("Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 18944, 152064, 32768, bias=True),
    _llama("Qwen/Qwen2.5-14B-Instruct", 48, 5120, 40, 8, 13824, 152064, 32768, bias=True),
    _llama("Qwen/Qwen2.5-32B-Instruct", 64, 5120, 40, 8, 27648, 152064, 32768, bias=True),
    _llama("Qwen/Qwen2.5-1.5B-Instruct", 28, 1536, 12, 2, 8960, 151936, 32768, tie=True, bias=True),
    _llama("mistralai/Mistral-7B-Instruct-v0.3", 32, 4096, 32, 8, 14336, 32768, 32768),
    # The tiny Llama the real-vLLM CPU tests build (docs/vllm-cpu.md#3-the-tiny-test-model):
    # KV 512 B/token.
    ModelProfile("autotune/tiny-llama", 2, 128, 4, 2, 32, 256, 2000, 4096),
)

_BY_NAME = {m.name.lower(): m for m in _BUILTIN}


def builtin_models() -> tuple[ModelProfile, ...]:
    return _BUILTIN


def _need(cfg: dict[str, Any], key: str, path: Path) -> int:
    if key not in cfg:
        raise ProfileError(f"{path}: field {key!r} is missing from the model config")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ProfileError(f"{path}: field {key!r} must be a positive integer, got {value!r}")
    return value


def load_model_config(path: str | Path, name: str | None = None) -> ModelProfile:
    """Read a Hugging Face ``config.json`` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if (why := special_file(p)) is not None:  # /dev/zero ended in a MemoryError traceback
        raise ProfileError(f"{p}: cannot read model config ({why})")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read model config ({exc.strerror or exc})") from exc
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{p}:{exc.lineno}: malformed JSON ({exc.msg})") from exc
    if not isinstance(cfg, dict):
        raise ProfileError(f"{p}:1: model config must be a JSON object")
    cfg = {**cfg.get("text_config", {}), **cfg}  # multimodal wrappers keep the LM inside
    hidden = _need(cfg, "hidden_size", p)
    heads = _need(cfg, "num_attention_heads", p)
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    lens = [int(cfg[k]) for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), int | float)]
    if not lens:
        raise ProfileError(f"{p}: field 'max_position_embeddings' is missing from the model config")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    arch = " ".join(cfg.get("architectures") or [])
    return ModelProfile(
        name=name or (str(p.parent) if p.name == "config.json" else str(p)),
        num_layers=_need(cfg, "num_hidden_layers", p),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(kv),
        head_dim=int(head_dim),
        intermediate_size=_need(cfg, "intermediate_size", p),
        vocab_size=_need(cfg, "vocab_size", p),
        max_position_embeddings=min(lens),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
        qkv_bias=bool(cfg.get("attention_bias", "Qwen2" in arch)),
        source=str(p),
    )


def get_model(name_or_path: str) -> ModelProfile:
    """A built-in model by name, or a folder / file holding a ``config.json``."""
    m = _BY_NAME.get(name_or_path.lower())
    if m is not None:
        return m
    p = Path(name_or_path)
    try:
        exists = p.exists()
    except OSError:  # e.g. ENAMETOOLONG for a 200 KB "name": no such folder either
        exists = False
    if exists:
        return load_model_config(p)
    known = ", ".join(m.name for m in _BUILTIN)
    raise ProfileError(
        f"unknown model {name_or_path!r}: not a built-in profile and no such folder; "
        f"give a folder with config.json or one of: {known}"
    )
