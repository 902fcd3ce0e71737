"""Engine args of the simulated engine, spelled and defaulted as ``vllm serve`` 0.32 does.

``EngineArgs`` holds what the user gave (``None`` = not set); :meth:`EngineArgs.resolve` applies
vLLM's defaulting rules for a model and device (GPU, or the CPU backend:
docs/simulator.md#41-the-cpu-backend) and returns :class:`ResolvedArgs`, in which every
value is concrete. Validation (and its exact error texts) lives in
``autotune.sim.config_checks``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from autotune.profiles.hardware import GiB, HardwareProfile
from autotune.profiles.models import ModelProfile

__all__ = ["EngineArgs", "ResolvedArgs"]


@dataclass(frozen=True)
class EngineArgs:
    max_model_len: int | None = None
    # None: the device's default (0.9 on GPUs, 0.92 on the CPU backend)
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    block_size: int | None = None  # None: the device's (16 on GPUs, 128 on the CPU backend)
    kv_cache_memory_bytes: int | None = None
    # The environment variable VLLM_CPU_KVCACHE_SPACE (whole GiB), read by the CPU backend
    # only; it wins over kv_cache_memory_bytes there (docs/vllm-cpu.md#4-serving).
    cpu_kvcache_space_gib: int | None = None
    long_prefill_token_threshold: int = 0
    enforce_eager: bool = False
    # -- sim-only knobs (not vLLM flags) --------------------------------------------
    # Memory other processes hold on the device at startup (simulates other tenants or a
    # leaked previous worker): vLLM then fails its free-memory check.
    sim_other_tenant_bytes: int = 0
    # Subtract an estimate of CUDA-graph memory inside profiling (vLLM >= ~0.21 default,
    # docs/vllm.md#22-cuda-graph-memory). Ignored with enforce_eager.
    sim_estimate_cudagraph_memory: bool = True

    def resolve(self, model: ModelProfile, hardware: HardwareProfile) -> ResolvedArgs:
        """Apply vLLM's defaults (2026-era rules) to the values not given.

        Only unset values are defaulted (docs/vllm.md#11-batch-defaults-per-gpu-class):
        1. chunked prefill off: ``mnbt = max(max_model_len, default)``;
        2. ``mnbt = min(max_num_seqs * max_model_len, mnbt)``;
        3. a defaulted ``max_num_seqs = min(max_num_seqs, mnbt)``.

        The device also picks the block size and the memory share when not given, and on
        the CPU backend ``cpu_kvcache_space_gib`` (the env var) replaces
        ``kv_cache_memory_bytes``; GPUs ignore it (docs/simulator.md#41-the-cpu-backend).
        """
        mml = self.max_model_len
        if mml is None:
            mml = model.max_position_embeddings
        d_mns, d_mnbt = hardware.vllm_server_defaults(max(1, self.tensor_parallel_size))
        mns = self.max_num_seqs if self.max_num_seqs is not None else d_mns
        if self.max_num_batched_tokens is not None:
            mnbt = self.max_num_batched_tokens
        else:
            mnbt = d_mnbt if self.enable_chunked_prefill else max(mml, d_mnbt)
            mnbt = min(mns * mml, mnbt)
        if self.max_num_seqs is None:
            mns = min(mns, mnbt)
        util = self.gpu_memory_utilization
        kv_bytes = self.kv_cache_memory_bytes
        if hardware.is_cpu and self.cpu_kvcache_space_gib is not None:
            kv_bytes = self.cpu_kvcache_space_gib * GiB
        return ResolvedArgs(
            max_model_len=mml,
            gpu_memory_utilization=hardware.default_memory_utilization if util is None else util,
            max_num_seqs=mns,
            max_num_batched_tokens=mnbt,
            enable_chunked_prefill=self.enable_chunked_prefill,
            enable_prefix_caching=self.enable_prefix_caching,
            tensor_parallel_size=self.tensor_parallel_size,
            block_size=hardware.default_block_size if self.block_size is None else self.block_size,
            kv_cache_memory_bytes=kv_bytes,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            enforce_eager=self.enforce_eager,
            sim_other_tenant_bytes=self.sim_other_tenant_bytes,
            sim_estimate_cudagraph_memory=self.sim_estimate_cudagraph_memory,
        )


@dataclass(frozen=True)
class ResolvedArgs:
    """Engine args with every value concrete (after vLLM's defaulting)."""

    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    tensor_parallel_size: int
    block_size: int
    # the KV bytes asked for: the flag, or on the CPU backend VLLM_CPU_KVCACHE_SPACE's GiB
    kv_cache_memory_bytes: int | None
    long_prefill_token_threshold: int
    enforce_eager: bool
    sim_other_tenant_bytes: int
    sim_estimate_cudagraph_memory: bool

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
