"""Startup memory accounting of the simulated engine: vLLM 0.32's checks, texts and KV sizing.

Pure functions, no I/O. The order of checks and every error text follow vLLM
(docs/vllm.md#2-startup-memory-accounting, docs/vllm.md#4-startup-errors,
docs/simulator.md#4-memory-model), read against vLLM's source where those notes were silent:

* config validation in ``create_engine_config`` order (:mod:`autotune.sim.config_checks`);
* ``gpu_worker.init_device``: ``requested = ceil(total * util)`` must fit in free memory. This
  check runs even with ``kv_cache_memory_bytes`` set, which only skips the profiling;
* ``determine_available_memory``: KV = requested - weights - activation peak - sampler logits -
  non-torch [- CUDA-graph estimate], then ``kv_cache_utils`` sizing and its two errors.

GiB numbers in texts use vLLM's ``format_gib`` (``round(x, 2)``, no padding: ``0.0 GiB``).
On GPU profiles the KV errors use GPU wording, without the "(... CPU backend ...)" asides of
the 0.32 CPU captures (vLLM's shared ``kv_cache_utils`` may print those on GPUs too
[uncertain]). A CPU-backend profile (docs/simulator.md#41-the-cpu-backend) prints the CPU
worker's texts: node 0's free-memory check only when the KV size is not explicit, the
"Explicitly set (X/Y) GiB for KV cache on node 0." line, the asides, "CPU KV cache size".
Log lines carry vLLM's process prefix but no timestamp (a pure function has no clock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.errors import SimStartupError
from autotune.failures import FailureClass
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.args import ResolvedArgs
from autotune.sim.config_checks import validate_config

__all__ = [
    "MemoryPlan",
    "activation_bytes_per_token",
    "cudagraph_memory_bytes",
    "estimate_max_model_len",
    "kv_blocks_from_pieces",
    "plan_memory",
]

GiB = 1024**3
# Peak activation per batched token = ACT_COEFF * (I/tp + H) * dtype_bytes: the gated MLP's
# gate_up output (2I) and activation output (I) plus ~3 hidden-sized buffers (residual, hidden,
# norm output). c = 3 reproduces vLLM issue #10517 (Llama-3.1-8B: 2.07 GiB at 20 000 tokens, 2.99 at
# 29 000) to 0.01 GiB: 0.1055 MiB/token vs the ~0.104 derived in
# docs/vllm.md#2-startup-memory-accounting. The intermediate size is sharded by TP,
# hidden-sized buffers are replicated. [derived, uncertain beyond Llama-8B]
ACT_COEFF = 3
# Non-torch memory (NCCL, cuBLAS workspaces): measured 0.35 GiB at TP=1; BLIS's 0.6 GiB at TP>1.
NON_TORCH_TP1 = int(0.35 * GiB)
NON_TORCH_TPN = int(0.6 * GiB)
# CUDA-graph estimate [uncertain]: each capture size costs GRAPH_BYTES_PER_LAYER per layer
# (piecewise graphs are one per layer), plus the pool holding the largest graph's activations.
# Gives ~0.45 GiB for Llama-8B at max_num_seqs >= 256 (the H100 example of
# docs/vllm.md#21-worked-examples assumes 0.4; reports range 0.3-1 GiB).
GRAPH_BYTES_PER_LAYER = 256 * 1024
# vLLM's default cudagraph_capture_sizes, cut at min(2 * max_num_seqs, 512, mnbt).
_CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))

_API = "(APIServer pid=1)"
_CORE = "(EngineCore pid=2)"
_WORKER = "(Worker pid=2)"  # the CPU backend's worker process (one process in the simulator)
_CORE_ERR = f"{_CORE} ERROR [core.py:1510]"
_ENGINE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}"
)
_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
# what the 0.32 CPU build inserts into the two KV errors (docs/vllm.md#42-kv-cache-errors)
_CPU_NO_MEMORY_ASIDE = (
    " (this flag also controls CPU memory reservation on the CPU backend, despite its name)"
)
_CPU_KV_ASIDE = " (which also controls CPU memory on the CPU backend)"


def _gib(b: float) -> str:
    """vLLM's ``format_gib``: ``round(b / GiB, 2)`` printed as Python prints the float."""
    return f"{round(b / GiB, 2)}"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- memory pieces ---------------------------------------------------------------------------
def activation_bytes_per_token(model: ModelProfile, tp: int = 1) -> int:
    """Profiled peak activation per batched token on one TP rank (see ``ACT_COEFF``)."""
    return ACT_COEFF * (model.intermediate_size // tp + model.hidden_size) * model.dtype_bytes


def cudagraph_memory_bytes(
    model: ModelProfile, tp: int, max_num_seqs: int, max_num_batched_tokens: int
) -> int:
    """CUDA-graph memory estimate on one TP rank [uncertain, see ``GRAPH_BYTES_PER_LAYER``]."""
    cap = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    n_sizes = sum(1 for s in _CAPTURE_SIZES if s <= cap)
    return n_sizes * model.num_layers * GRAPH_BYTES_PER_LAYER + cap * activation_bytes_per_token(
        model, tp
    )


def kv_blocks_from_pieces(
    total_bytes: float,
    utilization: float,
    weights_bytes: float,
    activation_bytes: float,
    non_torch_bytes: float,
    block_bytes_all_layers: float,
    sampler_bytes: float = 0,
    cudagraph_bytes: float = 0,
) -> int:
    """KV blocks vLLM allocates: ``floor((ceil(total * util) - non-KV pieces) / block)``.

    ``block_bytes_all_layers`` is one block across all layers (``page_size * num_layers``), so
    this equals vLLM's ``available // page_size // num_layers``. Returns 0 when nothing is
    left; a caller that must tell "no memory" from "less than a block" (vLLM raises only on
    available <= 0) checks the available bytes itself, as :func:`plan_memory` does.
    """
    available = math.ceil(total_bytes * utilization) - (
        weights_bytes + activation_bytes + non_torch_bytes + sampler_bytes + cudagraph_bytes
    )
    return max(0, int(available // block_bytes_all_layers))


def estimate_max_model_len(
    available_bytes: int, block_bytes_all_layers: int, block_size: int, max_model_len: int
) -> int:
    """vLLM's ``_estimate_max_model_len_from_groups``: binary search in ``[1, max_model_len]``
    for the largest length whose ``cdiv(len, block_size)`` blocks fit; 0 if one token does not."""

    def fits(n: int) -> bool:
        return _cdiv(n, block_size) * block_bytes_all_layers <= available_bytes

    if not fits(1):
        return 0
    left, right, result = 1, max_model_len, 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            result, left = mid, mid + 1
        else:
            right = mid - 1
    return result


# -- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPlan:
    """One rank's startup memory accounting (bytes) and the KV cache it yields."""

    total_bytes: int
    requested_bytes: int
    free_bytes_at_start: int
    weights_bytes: int
    activation_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    available_kv_bytes: int
    num_blocks: int
    block_size: int
    kv_tokens: int  # num_blocks * block_size, as vLLM reports it (the null block included)
    max_concurrency: float  # num_blocks / cdiv(max_model_len, block_size)
    log_lines: tuple[str, ...]


def _engine_failure(before: list[str], msg: str, fc: FailureClass) -> SimStartupError:
    """A ValueError in the EngineCore as vLLM logs it, then the API server's wrapper line."""
    lines = (
        *before,
        f"{_CORE_ERR} EngineCore failed to start.",
        f"{_CORE_ERR} Traceback (most recent call last):",
        f"{_CORE_ERR} ValueError: {msg}",
        _ENGINE_FAILED,
    )
    return SimStartupError(msg, fc, lines)


def _free_memory_text(cpu: bool, free: int, total: int, util: float, requested: int) -> str:
    """The free-memory error: GPU wording (vLLM 0.32 names the device, cuda:0), or the 0.32
    CPU backend's, which checks NUMA node 0 (docs/vllm.md#41-free-memory-below-the-request)."""
    if cpu:
        return (
            f"Available memory on node 0 ({_gib(free)}/{_gib(total)} GiB) on startup is less "
            f"than desired CPU memory utilization ({util}, {_gib(requested)} GiB). On the CPU "
            "backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory "
            "reserved (despite its name). To resolve: decrease `--gpu-memory-utilization` "
            "(e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used by other processes."
        )
    return (
        f"Free memory on device cuda:0 ({_gib(free)}/{_gib(total)} GiB) on startup is less "
        f"than desired GPU memory utilization ({util}, {_gib(requested)} GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes."
    )


def _explicit_kv_line(cpu: bool, free: int, total: int, kv: int) -> str:
    if cpu:  # tests/data/vllm032/startup.log: "Explicitly set (0.06/9.09) GiB ... on node 0."
        return (
            f"{_WORKER} INFO [cpu_worker.py:260] Explicitly set ({_gib(kv)}/{_gib(total)}) GiB "
            "for KV cache on node 0."
        )
    return (
        f"{_CORE} INFO [gpu_worker.py] Initial free memory {_gib(free)} GiB, reserved "
        f"{_gib(kv)} GiB memory for KV Cache as specified by "
        "kv_cache_memory_bytes config and skipped memory profiling. This does not "
        "respect the gpu_memory_utilization config. Only use kv_cache_memory_bytes "
        "config when you want manual control of KV cache memory size. If OOM'ed, "
        "check the difference of initial free memory between the current run and "
        "the previous run where kv_cache_memory_bytes is suggested and update it "
        "correspondingly."
    )


def plan_memory(model: ModelProfile, hardware: HardwareProfile, args: ResolvedArgs) -> MemoryPlan:
    """Run vLLM's startup for ``args``: validate, check free memory, profile, size the KV cache.

    Raises :class:`SimStartupError` exactly where vLLM 0.32 fails; on success returns the plan
    and the startup lines vLLM logs. A CPU-backend profile follows the 0.32 CPU worker
    (docs/simulator.md#41-the-cpu-backend).
    """
    validate_config(model, args)
    tp, bs, mml = args.tensor_parallel_size, args.block_size, args.max_model_len
    mns, mnbt, util = args.max_num_seqs, args.max_num_batched_tokens, args.gpu_memory_utilization
    cpu = hardware.is_cpu
    total = hardware.memory_bytes  # the CPU backend: NUMA node 0's memory
    free = total - args.sim_other_tenant_bytes
    requested = math.ceil(total * util)
    # The GPU worker tests truthiness (0 means "unset"); the CPU worker took
    # VLLM_CPU_KVCACHE_SPACE=0 as an explicit 0 GiB (tests/data/captures/bad_c_kvspace_0.log).
    kv_bytes = args.kv_cache_memory_bytes
    explicit = kv_bytes is not None if cpu else bool(kv_bytes)
    log: list[str] = []
    if args.enable_chunked_prefill:
        log.append(
            f"{_API} INFO [scheduler.py:307] Chunked prefill is enabled with "
            f"max_num_batched_tokens={mnbt}."
        )
    # GPUs check even with kv_cache_memory_bytes set; the CPU backend only when it sizes the
    # KV from the share (a real 0.92 with an explicit 1 GiB served where 0.92 alone failed).
    if free < requested and not (cpu and explicit):
        raise _engine_failure(
            log, _free_memory_text(cpu, free, total, util, requested), FailureClass.FREE_MEMORY
        )
    weights = model.weight_bytes(tp)
    if not cpu:  # the CPU loader logs seconds only ("Loading weights took 0.00 seconds")
        log.append(
            f"{_CORE} INFO [gpu_model_runner.py] Loading model weights took {weights / GiB:.4f} GB"
        )
    activation = activation_bytes_per_token(model, tp) * mnbt
    # Profile-run sampler: float32 logits [min(mnbt, mns), vocab]. Every TP rank holds the
    # gathered full-vocab logits, so this is not divided by TP.
    sampler = min(mnbt, mns) * model.vocab_size * 4
    non_torch = NON_TORCH_TP1 if tp == 1 else NON_TORCH_TPN
    cudagraph = 0
    if explicit:
        available = kv_bytes or 0
        log.append(_explicit_kv_line(cpu, free, total, available))
    else:
        # no CUDA graphs on the CPU backend
        if args.sim_estimate_cudagraph_memory and not args.enforce_eager and not cpu:
            cudagraph = cudagraph_memory_bytes(model, tp, mns, mnbt)
        non_kv = weights + activation + sampler + non_torch + cudagraph
        available = requested - non_kv
        if cpu:  # [uncertain] the wording of real 0.2x CPU logs, none captured on 0.32
            log.append(
                f"{_WORKER} INFO [cpu_worker.py:260] Auto set ({_gib(available)}/{_gib(total)}) "
                f"GiB for KV cache on node 0, with {_gib(requested)} GiB requested memory for "
                f"the worker. {_gib(non_kv)} GiB memory was consumed by non-kv usages."
            )
        else:
            log.append(
                f"{_CORE} INFO [gpu_worker.py] Available KV cache memory: {_gib(available)} GiB"
            )
        if cudagraph:
            delta = cudagraph / total
            log.append(
                f"{_CORE} INFO [gpu_worker.py] CUDA graph memory profiling is enabled (default "
                f"since v0.21.0). The current --gpu-memory-utilization={util:.4f} is equivalent "
                f"to --gpu-memory-utilization={round(util - delta, 4):.4f} without CUDA graph "
                "memory profiling. To maintain the same effective KV cache size as before, "
                f"increase --gpu-memory-utilization to {min(round(util + delta, 4), 1.0):.4f}. "
                "To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
            )
    if available <= 0:
        # the CPU build's aside before the period (docs/vllm.md#42-kv-cache-errors)
        aside = _CPU_NO_MEMORY_ASIDE if cpu else ""
        raise _engine_failure(
            log,
            (
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                f"when initializing the engine{aside}. {_DOCS}"
            ),
            FailureClass.NO_KV_MEMORY,
        )
    block_bytes = model.page_bytes_per_layer(bs, tp) * model.num_layers
    num_blocks = available // block_bytes
    per_request = _cdiv(mml, bs)
    # vLLM 0.32's BlockPool holds one "null block" back, and get_kv_cache_configs checks and
    # estimates against the memory minus that block (seen on real vLLM: 4 blocks of 128
    # tokens -> estimate 384; exactly cdiv(max_model_len, block_size) blocks -> KV_TOO_SMALL).
    usable = available - block_bytes
    if per_request * block_bytes > usable:  # == vLLM's needed_memory > available_memory
        est = estimate_max_model_len(max(usable, 0), block_bytes, bs, mml)
        est_msg = (
            f"Based on the available memory, the estimated maximum model length is {est}. "
            if est > 0
            else ""
        )
        raise _engine_failure(
            log,
            (
                f"To serve at least one request with the model's max seq len ({mml}), "
                f"({_gib(per_request * block_bytes)} GiB KV cache is needed, which is larger than "
                f"the available KV cache memory ({_gib(max(usable, 0))} GiB). {est_msg}Try "
                f"increasing `gpu_memory_utilization`{_CPU_KV_ASIDE if cpu else ''} or "
                "decreasing `max_model_len` when initializing the engine. "
                f"{_DOCS}"
            ),
            FailureClass.KV_TOO_SMALL,
        )
    concurrency = num_blocks / per_request
    # 0.32 logs (and labels kv_cache_size_tokens with) int(concurrency * max_model_len), which
    # equals kv_tokens whenever block_size divides max_model_len. The CPU backend says "CPU".
    log.append(
        f"{_CORE} INFO [kv_cache_utils.py:2327] {'CPU' if cpu else 'GPU'} KV cache size: "
        f"{int(concurrency * mml):,} tokens, Maximum concurrency for {mml:,} tokens per "
        f"request: {concurrency:.2f}x"
    )
    return MemoryPlan(
        total_bytes=total,
        requested_bytes=requested,
        free_bytes_at_start=free,
        weights_bytes=weights,
        activation_bytes=activation,
        sampler_bytes=sampler,
        non_torch_bytes=non_torch,
        cudagraph_bytes=cudagraph,
        available_kv_bytes=available,
        num_blocks=num_blocks,
        block_size=bs,
        kv_tokens=num_blocks * bs,
        max_concurrency=concurrency,
        log_lines=tuple(log),
    )
