"""Which tensor-parallel sizes a model can run with on a node of ``devices`` GPUs
(docs/sizing.md#2-tensor-parallel-candidates).

A candidate divides the node's device count (a TP group never spans nodes here; data and
pipeline parallelism are out of scope, replicas are separate servers) and passes vLLM's own
head-divisibility rule (:meth:`~autotune.profiles.models.ModelProfile.tp_error`). Whether
the weights then fit a rank's memory is the simulator's startup check, which names the
failure as vLLM would. Pure.
"""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.profiles.models import ModelProfile

__all__ = ["tp_candidates"]


def tp_candidates(model: ModelProfile, devices: int) -> list[int]:
    """Tensor-parallel sizes for ``model`` on a node of ``devices`` GPUs, ascending."""
    if devices < 1:
        raise ConfigError(f"devices per node must be >= 1, got {devices}")
    out = [t for t in range(1, devices + 1) if devices % t == 0 and model.tp_error(t) is None]
    if not out:  # tp 1 always passes the head rule: only an impossible device count gets here
        raise ConfigError(f"no tensor-parallel size of {model.name} fits {devices} device(s)")
    return out
