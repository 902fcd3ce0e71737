"""The search space, suggested define-by-run in a fixed order (pure; no I/O).

Order: ``max_model_len`` -> ``gpu_memory_utilization`` -> ``max_num_seqs`` ->
``max_num_batched_tokens`` (free memory first, then concurrency: the seed guide's method,
docs/method.md#4-one-variable-at-a-time-in-a-fixed-order), then optional extra parameters.

Model-based samplers (TPE, GP) drop a parameter whose distribution changes between trials
and fall back to independent sampling. ``max_num_batched_tokens`` depends on earlier choices
(vLLM requires ``>= max_num_seqs``, and ``>= max_model_len`` with chunked prefill off), so it
is sampled on a FIXED log range (``search.max_num_batched_tokens``) and, where the earlier
values need more, raised to the valid minimum: the sampler's value IS the engine value
whenever it is valid, and Optuna keeps the raw suggestion beside the engine value the trial
ran with (docs/tuning.md#8-the-staged-plan). An earlier version sampled a unit fraction of
the valid range; its engine value moved whenever ``max_num_seqs`` did, so a stage that "held
the token budget fixed" did not, and the dashboard ranked an internal fraction as the most
important parameter. Every suggestion passes vLLM's startup validation; memory failures
cannot be known before a launch and are learned through constraints instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "MNBT_PARAM",
    "PARAM_ORDER",
    "TP_PARAM",
    "EngineValues",
    "SpaceBounds",
    "TrialLike",
    "enqueue_params",
    "max_model_len_candidates",
    "mnbt_engine_value",
    "mnbt_range",
    "suggest",
]

PARAM_ORDER = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")
MNBT_PARAM = "max_num_batched_tokens"  # the sampler's parameter is the engine value
# the parallelism stage's parameter, suggested before the four when search.parallelism is set
# (docs/tuning.md#16-the-parallelism-stage)
TP_PARAM = "tensor_parallel_size"


class TrialLike(Protocol):
    """The part of ``optuna.Trial`` the space uses (a fake in tests)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int: ...


@dataclass(frozen=True)
class SpaceBounds:
    max_model_len_candidates: tuple[int, ...]
    util_low: float = 0.80
    util_high: float = 0.95
    mns_low: int = 8
    mns_high: int = 512
    mnbt_low: int = 256
    mnbt_high: int = 65536
    enable_chunked_prefill: bool = True
    extras: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    # worker.static_args.kv_cache_memory_bytes as the config writes it, when it fixes the KV
    # cache's size: gpu_memory_utilization then sizes nothing and its stage gets no trial
    # (docs/tuning.md#8-the-staged-plan); None: the fraction sizes the KV cache
    kv_cache_memory_bytes: str | None = None
    # tensor_parallel_size candidates of the parallelism stage, ascending; () when the
    # study does not search parallelism (docs/tuning.md#16-the-parallelism-stage)
    parallel: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.max_model_len_candidates:
            raise ValueError("at least one max_model_len candidate is needed")
        if not 0 < self.util_low <= self.util_high <= 1:
            raise ValueError("need 0 < util_low <= util_high <= 1")
        if not 1 <= self.mns_low <= self.mns_high:
            raise ValueError("need 1 <= mns_low <= mns_high")
        if not 1 <= self.mnbt_low <= self.mnbt_high:
            raise ValueError("need 1 <= mnbt_low <= mnbt_high")


@dataclass(frozen=True)
class EngineValues:
    """What a trial passes to vLLM (engine values), plus the raw suggestions."""

    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    extras: Mapping[str, Any] = field(default_factory=dict)

    def engine_args(self) -> dict[str, Any]:
        """In the fixed order, extras after the four."""
        return {
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            **self.extras,
        }


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def max_model_len_candidates(
    p95: int, p99: int, max_len: int, *, margin: float, model_max: int, multiple: int = 256
) -> tuple[int, ...]:
    """p95, p99 and max of prompt+output, each plus ``margin`` and rounded up to a multiple
    of 256, capped at the model's maximum (seed guide: size max_model_len to the real length
    distribution, never the model maximum;
    docs/method.md#5-sizing-the-maximum-model-length-from-real-lengths)."""
    out = sorted(
        {min(_round_up(v * (1 + margin), multiple), model_max) for v in (p95, p99, max_len)}
    )
    return tuple(out)


def mnbt_range(
    b: SpaceBounds, max_model_len: int, max_num_seqs: int, chunked_prefill: bool
) -> tuple[int, int]:
    """Valid max_num_batched_tokens for the earlier choices (vLLM's SchedulerConfig rules)."""
    lo = max(b.mnbt_low, max_num_seqs, 0 if chunked_prefill else max_model_len)
    return lo, max(b.mnbt_high, lo)


def mnbt_engine_value(suggested: int, lo: int, hi: int) -> int:
    """The engine value of a suggestion: itself when valid, else raised (or cut) into
    ``[lo, hi]``, the range the earlier choices allow (:func:`mnbt_range`)."""
    return min(max(int(suggested), lo), hi)


def suggest(trial: TrialLike, b: SpaceBounds) -> EngineValues:
    """Suggest one configuration, strictly in :data:`PARAM_ORDER`, extras last; the
    parallelism first when the study searches it."""
    tp = (
        {TP_PARAM: int(trial.suggest_categorical(TP_PARAM, list(b.parallel)))} if b.parallel else {}
    )
    mml = int(trial.suggest_categorical("max_model_len", list(b.max_model_len_candidates)))
    util = trial.suggest_float("gpu_memory_utilization", b.util_low, b.util_high, step=0.01)
    mns = trial.suggest_int("max_num_seqs", b.mns_low, b.mns_high, log=True)
    raw = trial.suggest_int(MNBT_PARAM, b.mnbt_low, b.mnbt_high, log=True)
    extras = {name: trial.suggest_categorical(name, list(choices)) for name, choices in b.extras}
    chunked = bool(extras.get("enable_chunked_prefill", b.enable_chunked_prefill))
    lo, hi = mnbt_range(b, mml, mns, chunked)
    value = mnbt_engine_value(raw, lo, hi)
    return EngineValues(mml, round(util, 4), mns, value, {**tp, **extras})


def enqueue_params(b: SpaceBounds, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The sampler's parameters for known engine args (to enqueue the baseline): the engine
    values themselves (the trial runs the enqueued engine args, kept beside them)."""
    out = {
        "max_model_len": int(engine_args["max_model_len"]),
        "gpu_memory_utilization": float(engine_args["gpu_memory_utilization"]),
        "max_num_seqs": int(engine_args["max_num_seqs"]),
        MNBT_PARAM: int(engine_args["max_num_batched_tokens"]),
    }
    for name, choices in b.extras:
        out[name] = engine_args.get(name, choices[0])
    if b.parallel:
        out[TP_PARAM] = int(engine_args.get(TP_PARAM, b.parallel[0]))
    return out
