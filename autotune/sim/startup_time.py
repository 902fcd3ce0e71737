"""How long vLLM takes to start on a GPU: the modelled start-up a simulated worker is charged
for (docs/cost.md#2-the-start-up-model). The simulator serves in virtual time, so nothing here
is measured on this host; every constant comes from start-up logs others published, cited in
docs/cost.md, and is uncertain by about a factor of 2 either way (the same docs say why).

A start runs in phases: the process, its imports and the API server (``overhead``), reading
the weights (``weights``: one rank's bytes over the load bandwidth), ``torch.compile``
(``compile``, skipped with ``enforce_eager``), memory profiling and the KV allocation
(``profile``) and the CUDA-graph capture (``graphs``, skipped with ``enforce_eager``). A start
that fails stops where vLLM stops: a rejected argument while the engine args are checked
(after the imports), a memory error after profiling, before any graph is captured
(docs/vllm.md#4-startup-errors). Pure: values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.failures import FailureClass
from autotune.profiles.models import ModelProfile

__all__ = [
    "ARG_CHECK_S",
    "COMPILE_S",
    "GRAPH_CAPTURE_S",
    "OVERHEAD_S",
    "PROFILE_S",
    "WEIGHT_LOAD_BPS",
    "StartupEstimate",
    "modelled_startup",
]

GiB = 1024**3

# Phases of one start, in seconds on the GPU (docs/cost.md#2-the-start-up-model has the
# sources and the range each was seen in).
OVERHEAD_S = 25.0  # process start, imports, API server: launch to response, less the logged
WEIGHT_LOAD_BPS = 3.8 * GiB  # weights read from the page cache, per rank
COMPILE_S = 19.4  # torch.compile of a new config (its cache key holds the engine config)
PROFILE_S = 4.0  # memory profiling and the KV cache allocation
GRAPH_CAPTURE_S = 15.0  # CUDA-graph capture of the default sizes
ARG_CHECK_S = 8.0  # a rejected engine argument: the imports, then the error

# failures raised while vLLM checks its arguments, before any weight is read
_ARG_ERRORS = frozenset(
    {
        FailureClass.MNBT_LT_MAXLEN,
        FailureClass.MNBT_LT_MNS,
        FailureClass.MAXLEN_GT_MODEL,
        FailureClass.CONFIG_INVALID,
        FailureClass.PORT_IN_USE,
    }
)


@dataclass(frozen=True)
class StartupEstimate:
    """One modelled start, by phase (seconds); ``total_s`` is what a worker is charged."""

    overhead_s: float
    weights_s: float
    compile_s: float
    profile_s: float
    graphs_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + self.weights_s + self.compile_s + self.profile_s + self.graphs_s


def modelled_startup(
    model: ModelProfile,
    *,
    tensor_parallel_size: int = 1,
    enforce_eager: bool = False,
    failure: FailureClass | None = None,
) -> StartupEstimate:
    """The start of ``vllm serve`` for ``model`` on one rank of ``tensor_parallel_size``
    (ranks start in parallel), or, with ``failure``, how far a start that failed so got."""
    if failure in _ARG_ERRORS:
        return StartupEstimate(ARG_CHECK_S, 0.0, 0.0, 0.0, 0.0)
    weights = model.weight_bytes(max(1, tensor_parallel_size)) / WEIGHT_LOAD_BPS
    compile_s = 0.0 if enforce_eager else COMPILE_S
    graphs = 0.0 if enforce_eager or failure is not None else GRAPH_CAPTURE_S
    return StartupEstimate(OVERHEAD_S, weights, compile_s, PROFILE_S, graphs)
