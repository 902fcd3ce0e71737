"""The one list of worker failure classes (stored and exported as ``failure_class``).

Classes and matching rules follow docs/vllm.md#44-failure-classes-and-matching-rules (vLLM 0.32
strings, GPU and CPU wording), plus our own for lifecycle failures: ``STARTUP_TIMEOUT``,
``PORT_IN_USE``, ``KILLED``, ``HUNG``, ``UNKNOWN``. Every later layer (simulated engine, log
classifier, scoring, storage) uses these values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ARGS_CANNOT_START",
    "FailureClass",
    "FailureMatch",
    "classify_log",
    "parse_estimated_max_len",
]


class FailureClass(StrEnum):
    FREE_MEMORY = "FREE_MEMORY"
    NO_KV_MEMORY = "NO_KV_MEMORY"
    KV_TOO_SMALL = "KV_TOO_SMALL"
    MNBT_LT_MAXLEN = "MNBT_LT_MAXLEN"
    MNBT_LT_MNS = "MNBT_LT_MNS"
    MAXLEN_GT_MODEL = "MAXLEN_GT_MODEL"
    CONFIG_INVALID = "CONFIG_INVALID"
    RUNTIME_OOM = "RUNTIME_OOM"
    ENGINE_DEAD = "ENGINE_DEAD"
    STARTUP_TIMEOUT = "STARTUP_TIMEOUT"
    PORT_IN_USE = "PORT_IN_USE"
    # a signal from outside ended the worker, or it stopped making progress: not the
    # configuration's doing, so retried once (autotune/workers/cause.py)
    KILLED = "KILLED"
    HUNG = "HUNG"
    UNKNOWN = "UNKNOWN"


# start failures that the engine arguments, the model and the hardware alone decide: the same
# launch fails the same way every time (not FREE_MEMORY: another process may hold the memory)
ARGS_CANNOT_START = frozenset(
    {
        FailureClass.NO_KV_MEMORY,
        FailureClass.KV_TOO_SMALL,
        FailureClass.MNBT_LT_MAXLEN,
        FailureClass.MNBT_LT_MNS,
        FailureClass.MAXLEN_GT_MODEL,
        FailureClass.CONFIG_INVALID,
    }
)


@dataclass(frozen=True)
class FailureMatch:
    failure_class: FailureClass
    line: str
    # vLLM's binary-searched estimate, parsed from KV_TOO_SMALL texts; None elsewhere.
    estimated_max_model_len: int | None = None


_EST_RE = re.compile(r"estimated maximum model length is (\d+)")
_V0_KV_RE = re.compile(r"maximum number of tokens that can be stored in KV cache \((\d+)\)")

# Ordered: specific root causes first, wrappers ("validation error for ...") last, so a
# log holding both the root cause and vLLM's wrapper lines gets the root cause.
_RULES: tuple[tuple[FailureClass, tuple[str, ...]], ...] = (
    (FailureClass.FREE_MEMORY, ("on startup is less than desired", "memory utilization")),
    (FailureClass.NO_KV_MEMORY, ("No available memory for the cache blocks",)),
    (
        FailureClass.KV_TOO_SMALL,
        ("To serve at least one request with the model", "KV cache is needed"),
    ),
    (
        FailureClass.KV_TOO_SMALL,
        ("is larger than the maximum number of tokens that can be stored in KV cache",),
    ),
    (FailureClass.MNBT_LT_MAXLEN, ("is smaller than max_model_len",)),
    (FailureClass.MNBT_LT_MNS, ("must be greater than or equal to max_num_seqs",)),
    (FailureClass.MAXLEN_GT_MODEL, ("is greater than the derived max_model_len",)),
    (FailureClass.RUNTIME_OOM, ("CUDA out of memory",)),
    (FailureClass.RUNTIME_OOM, ("OutOfMemoryError",)),
    (FailureClass.PORT_IN_USE, ("Address already in use",)),
    # uvicorn's wording: "[Errno 98] error while attempting to bind on address (...): address
    # already in use"
    (FailureClass.PORT_IN_USE, ("error while attempting to bind on address",)),
    (FailureClass.ENGINE_DEAD, ("EngineDeadError",)),
    (FailureClass.ENGINE_DEAD, ("Worker failed with error",)),
    (FailureClass.CONFIG_INVALID, ("validation error for SchedulerConfig",)),
    (FailureClass.CONFIG_INVALID, ("validation error for ModelConfig",)),
    (FailureClass.CONFIG_INVALID, ("validation error for CacheConfig",)),
    (FailureClass.CONFIG_INVALID, ("validation error for",)),
    # pydantic pluralises: "2 validation errors for SchedulerConfig" (e.g. mns=0 and mnbt=0).
    (FailureClass.CONFIG_INVALID, ("validation errors for",)),
)


def parse_estimated_max_len(text: str) -> int | None:
    """vLLM's estimated maximum model length from a KV_TOO_SMALL text (V1 or V0 wording)."""
    m = _EST_RE.search(text) or _V0_KV_RE.search(text)
    return int(m.group(1)) if m else None


def classify_log(lines: Iterable[str]) -> FailureMatch | None:
    """Classify a worker log. The whole log is read: vLLM prints the root cause above its
    ``Engine core initialization failed`` wrapper. Returns None when nothing matches."""
    text_lines = list(lines)
    for cls, needles in _RULES:
        for line in text_lines:
            if all(n in line for n in needles):
                est = parse_estimated_max_len(line) if cls is FailureClass.KV_TOO_SMALL else None
                return FailureMatch(cls, line.strip(), est)
    return None
