"""Hardware profiles for the simulated engine: GPUs, and vLLM's CPU backend.

Peak numbers are vendor spec sheets; efficiencies (eta) come from
docs/simulator.md#32-constants-and-their-sources, where A100/H100 values are derived from
Vidur's published profiles and every other GPU borrows them (marked ``uncertain``).
``memory_bytes`` is what the CUDA runtime reports as total memory
(``torch.cuda.mem_get_info()[1]``), which is less than the marketing number.

A profile with ``backend="cpu"`` stands for vLLM's CPU backend
(docs/simulator.md#41-the-cpu-backend): its ``memory_bytes`` is NUMA node 0's memory as
vLLM's CPU worker reports it, the memory ``--gpu-memory-utilization`` is a share of. CPU
profiles are kept apart from :func:`builtin_hardware` (the GPU profiles, whose constants key
cached benchmark results, docs/tuning.md#6-the-tuning-quality-benchmark);
:func:`get_hardware` finds both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.errors import ProfileError

__all__ = [
    "CPU_BLOCK_SIZE",
    "CPU_MEMORY_UTILIZATION",
    "GPU_BLOCK_SIZE",
    "GPU_MEMORY_UTILIZATION",
    "Backend",
    "HardwareProfile",
    "builtin_cpu_hardware",
    "builtin_hardware",
    "get_hardware",
]

GiB = 1024**3
Backend = Literal["cuda", "cpu"]
# vLLM's KV block size when --block-size is not given (docs/vllm.md#2-startup-memory-accounting)
GPU_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128  # seen on the 0.32 CPU backend (tests/data/vllm032/meta.json)
# --gpu-memory-utilization when not given (docs/vllm.md#1-engine-args-and-their-defaults): the
# 0.32 CPU backend reported 0.92 (its free-memory error, and cache_config_info on /metrics)
GPU_MEMORY_UTILIZATION = 0.9
CPU_MEMORY_UTILIZATION = 0.92


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    mem_bw: float  # HBM bytes/s
    memory_bytes: int  # total device memory as the CUDA runtime reports it
    eta_bw: float = 0.77  # achieved fraction of mem_bw on weight reads
    eta_f: float = 0.73  # achieved fraction of peak_flops on linear layers
    # decode paged-attention KV reads (uncertain, docs/simulator.md#32-constants-and-their-sources)
    eta_attn: float = 0.55
    eta_fa: float = 0.5  # prefill flash-attention FLOPs (uncertain)
    interconnect_bw: float = 450e9  # NVLink per-direction B/s for TP all-reduce (uncertain)
    allreduce_latency: float = 10e-6  # alpha per all-reduce (uncertain)
    device_name: str = ""  # as torch names it; vLLM's batch defaults look for "a100" in it
    uncertain: str = ""  # which numbers are not measured, and their source
    # a calibrated profile's simulator constants by name: the step cost's own (t_fixed, ...)
    # and the API server's as "front_end.<name>" (autotune.sim.twin); no built-in sets any
    sim_overrides: tuple[tuple[str, float], ...] = ()
    # which vLLM platform runs: "cpu" for the CPU backend (docs/simulator.md#41-the-cpu-backend)
    backend: Backend = "cuda"

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    @property
    def is_cpu(self) -> bool:
        return self.backend == "cpu"

    @property
    def default_block_size(self) -> int:
        """The KV block size vLLM picks when ``--block-size`` is not given."""
        return CPU_BLOCK_SIZE if self.is_cpu else GPU_BLOCK_SIZE

    @property
    def default_memory_utilization(self) -> float:
        """``--gpu-memory-utilization`` when not given (0.9 on GPUs, 0.92 on the CPU backend)."""
        return CPU_MEMORY_UTILIZATION if self.is_cpu else GPU_MEMORY_UTILIZATION

    def vllm_server_defaults(self, world_size: int = 1) -> tuple[int, int]:
        """``vllm serve`` defaults (max_num_seqs, max_num_batched_tokens) for this device
        class: ``EngineArgs.get_batch_defaults`` (docs/vllm.md#11-batch-defaults-per-gpu-class):
        >= 70 GiB and not an A100 -> 1024/8192, otherwise 256/2048; the CPU backend 128/2048
        times the world size (PP x TP; ``world_size``, which GPUs ignore)."""
        if self.is_cpu:
            return 128 * world_size, 2048 * world_size
        if self.memory_gib >= 70 and "a100" not in self.device_name.lower():
            return 1024, 8192
        return 256, 2048


def _gib(x: float) -> int:
    return int(x * GiB)


_BUILTIN: tuple[HardwareProfile, ...] = (
    HardwareProfile(
        "A100-40GB",
        312e12,
        1.555e12,
        _gib(39.39),
        0.77,
        0.73,
        device_name="NVIDIA A100-SXM4-40GB",
        uncertain="mem_bw spec sheet, memory typical torch output; eta borrowed from A100-80GB",
    ),
    HardwareProfile(
        "A100-80GB",
        312e12,
        2.039e12,
        _gib(79.15),
        0.77,
        0.73,
        interconnect_bw=300e9,
        device_name="NVIDIA A100-SXM4-80GB",
        uncertain=(
            "memory typical torch output; eta derived from Vidur profiles "
            "(docs/simulator.md#32-constants-and-their-sources)"
        ),
    ),
    HardwareProfile(
        "H100-80GB",
        989e12,
        3.35e12,
        _gib(79.2),
        0.80,
        0.73,
        interconnect_bw=450e9,
        device_name="NVIDIA H100 80GB HBM3",
        uncertain=(
            "reported memory 79.2 GiB per docs/vllm.md#21-worked-examples (uncertain); "
            "eta derived from Vidur"
        ),
    ),
    HardwareProfile(
        "H200",
        989e12,
        4.8e12,
        _gib(139.8),
        0.80,
        0.73,
        interconnect_bw=450e9,
        device_name="NVIDIA H200",
        uncertain="spec sheet; eta borrowed from H100; reported memory typical torch output",
    ),
    HardwareProfile(
        "L40S",
        362e12,
        0.864e12,
        _gib(44.4),
        0.77,
        0.73,
        interconnect_bw=32e9,
        device_name="NVIDIA L40S",
        uncertain="spec sheet (BLIS hardware_config agrees); eta borrowed; PCIe all-reduce",
    ),
    HardwareProfile(
        "A10G",
        70e12,
        0.6e12,
        _gib(22.0),
        0.77,
        0.73,
        interconnect_bw=32e9,
        device_name="NVIDIA A10G",
        uncertain="A10G tensor peak commonly reported ~70 TFLOP/s (A10 spec: 125); eta borrowed",
    ),
    HardwareProfile(
        "L4",
        121e12,
        0.3e12,
        _gib(22.03),
        0.77,
        0.73,
        interconnect_bw=32e9,
        device_name="NVIDIA L4",
        uncertain="spec sheet (242e12 with sparsity); eta borrowed",
    ),
    # A deliberately small device for tests: 4 GiB, slow, so tiny models saturate it.
    HardwareProfile(
        "test-4GB",
        10e12,
        0.1e12,
        _gib(4.0),
        0.8,
        0.7,
        device_name="autotune test device",
        uncertain="synthetic test profile",
    ),
)

# vLLM's CPU backend on a machine like the one docs/vllm-cpu.md#4-serving describes (2 x86_64
# vCPUs with AVX-512, vLLM's worker pinned to one core, the other reserved). Node 0 memory is
# what its startup log printed (tests/data/vllm032/startup.log: "(0.06/9.09) GiB"); peak and
# bandwidth are plausible figures for one such core, not measured.
_BUILTIN_CPU: tuple[HardwareProfile, ...] = (
    HardwareProfile(
        "CPU",
        200e9,
        20e9,
        _gib(9.09),
        interconnect_bw=10e9,
        device_name="x86_64 CPU (2 vCPU, AVX-512)",
        uncertain=(
            "peak_flops ~ one AVX-512 core (2 FMA ports x 16 fp32 x 2 x ~3 GHz) and mem_bw "
            "~ one core's DRAM share are plausible, not measured; eta borrowed from the GPUs; "
            "interconnect_bw (TP over shared memory) a guess; node 0 memory 9.09 GiB as one "
            "real 0.32 startup printed (runs saw 8.7-10.5)"
        ),
        backend="cpu",
    ),
)

_BY_NAME = {h.name.lower(): h for h in (*_BUILTIN, *_BUILTIN_CPU)}


def builtin_hardware() -> tuple[HardwareProfile, ...]:
    """The built-in GPU profiles (the ones the engine fingerprint covers)."""
    return _BUILTIN


def builtin_cpu_hardware() -> tuple[HardwareProfile, ...]:
    """The built-in profiles of vLLM's CPU backend."""
    return _BUILTIN_CPU


def get_hardware(name: str) -> HardwareProfile:
    """A built-in profile by name (case ignored), GPU or CPU."""
    try:
        return _BY_NAME[name.lower()]
    except KeyError:
        known = ", ".join(h.name for h in (*_BUILTIN, *_BUILTIN_CPU))
        raise ProfileError(
            f"unknown hardware profile {name!r}; known: {known} (see `autotune sim hardware`)"
        ) from None
