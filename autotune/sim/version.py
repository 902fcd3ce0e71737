"""The simulated engine's behaviour version and a fingerprint of its constants.

Results computed with the simulator and kept on disk (the tuning-quality benchmark's ground
truth, ``benchmarks/data/``) are keyed by :func:`engine_fingerprint`: a hash of the step-cost,
memory and scheduler constants, the built-in GPU and model profiles, and
:data:`ENGINE_MODEL_VERSION`. Changing a constant changes the key by itself; changing the
engine's *code* in a way that moves results does not, so bump the version with it
(``tests/test_golden_capacity.py`` fails until you do;
docs/tuning.md#6-the-tuning-quality-benchmark).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from typing import Any

from autotune.profiles.hardware import (
    GPU_BLOCK_SIZE,
    GPU_MEMORY_UTILIZATION,
    HardwareProfile,
    builtin_hardware,
)
from autotune.profiles.models import builtin_models
from autotune.sim import costs, frontend, memory
from autotune.sim.args import EngineArgs

__all__ = ["ENGINE_MODEL_VERSION", "engine_constants", "engine_fingerprint"]

# Bump when the engine's behaviour changes (scheduler, cost formula, memory accounting), then
# regenerate benchmarks/data (python benchmarks/tuning_quality.py --refresh-truth).
ENGINE_MODEL_VERSION = 2  # 2: the API server's work (autotune.sim.frontend)

# EngineArgs fields whose default (None) means "the device's": hashed as the GPU value they
# resolve to, the constant they were before the CPU backend existed, so GPU results keep their
# key (docs/simulator.md#41-the-cpu-backend).
_GPU_DEFAULTS: dict[str, object] = {
    "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
    "block_size": GPU_BLOCK_SIZE,
}
# Read by the CPU backend only; no GPU result depends on it.
_CPU_ONLY_ARGS = frozenset({"cpu_kvcache_space_gib"})


def _hardware_entry(h: HardwareProfile) -> dict[str, Any]:
    """A GPU profile's fields; sim_overrides (set only by calibrated profiles, never by a
    built-in) and the default backend left out, as before that field existed."""
    return {
        k: v
        for k, v in asdict(h).items()
        if k != "sim_overrides" and not (k == "backend" and v == "cuda")
    }


def engine_constants() -> dict[str, Any]:
    """Every constant the simulated engine's results depend on, as plain JSON values."""
    return {
        "version": ENGINE_MODEL_VERSION,
        "costs": {
            "eps_elem": costs.DEFAULT_EPS_ELEM,
            "t_fixed": costs.DEFAULT_T_FIXED,
            "t_req": costs.DEFAULT_T_REQ,
        },
        "front_end": asdict(frontend.DEFAULT_FRONT_END),
        "memory": {
            "act_coeff": memory.ACT_COEFF,
            "non_torch_tp1": memory.NON_TORCH_TP1,
            "non_torch_tpn": memory.NON_TORCH_TPN,
            "graph_bytes_per_layer": memory.GRAPH_BYTES_PER_LAYER,
            "capture_sizes": list(memory._CAPTURE_SIZES),
        },
        # the scheduler's knobs and their defaults
        "scheduler": {
            f.name: repr(_GPU_DEFAULTS.get(f.name, f.default))
            for f in fields(EngineArgs)
            if f.name not in _CPU_ONLY_ARGS
        },
        # the GPU profiles only: CPU ones (builtin_cpu_hardware) key no cached result
        "hardware": [_hardware_entry(h) for h in builtin_hardware()],
        "models": [asdict(m) for m in builtin_models()],
    }


def engine_fingerprint() -> str:
    """A short hash of :func:`engine_constants`."""
    text = json.dumps(engine_constants(), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
