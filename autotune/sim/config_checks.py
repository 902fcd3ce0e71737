"""vLLM 0.32's config validation for the simulated engine: what ``create_engine_config``
rejects before any memory is touched, with vLLM's exact texts (pydantic ``ValidationError``
tracebacks; docs/vllm.md#4-startup-errors).

Checks run in ``create_engine_config`` order: ``ModelConfig`` (max_model_len), then
``CacheConfig`` (pydantic field bounds), ``SchedulerConfig`` (field bounds, then
``verify_max_model_len``), then ``VllmConfig`` (TP must divide the attention heads; its
pydantic wrapping is inferred, not captured). Pure functions, no I/O; the memory plan
(:func:`autotune.sim.memory.plan_memory`) runs them first.
"""

from __future__ import annotations

from autotune.errors import SimStartupError
from autotune.failures import FailureClass
from autotune.profiles.models import ModelProfile
from autotune.sim.args import ResolvedArgs

__all__ = ["validate_config"]

_PYDANTIC_URL = "    For further information visit https://errors.pydantic.dev/2.14/v/"


def _args_kwargs(items: list[tuple[str, object]]) -> str:
    """The ``input_value`` pydantic prints: the ArgsKwargs repr cut to 25 + '...' + 24 chars."""
    s = "ArgsKwargs((), {" + ", ".join(f"{k!r}: {v!r}" for k, v in items) + "})"
    return s if len(s) <= 50 else f"{s[:25]}...{s[-24:]}"


def _config_error(cls: str, body: list[str], message: str, fc: FailureClass) -> SimStartupError:
    """A pydantic ``ValidationError`` as vLLM 0.32 prints it (traceback tail only)."""
    n = sum(1 for line in body if line.startswith(_PYDANTIC_URL))
    head = f"{n} validation error{'s' if n > 1 else ''} for {cls}"
    lines = (
        "Traceback (most recent call last):",
        f"pydantic_core._pydantic_core.ValidationError: {head}",
        *body,
    )
    return SimStartupError(message or "\n".join([head, *body]), fc, lines)


def _value_error(
    cls_name: str, msg: str, items: list[tuple[str, object]], fc: FailureClass
) -> SimStartupError:
    body = [
        f"  Value error, {msg} [type=value_error, input_value={_args_kwargs(items)}, "
        "input_type=ArgsKwargs]",
        f"{_PYDANTIC_URL}value_error",
    ]
    return _config_error(cls_name, body, msg, fc)


def _field_errors(cls_name: str, bad: list[tuple[str, object, str, str]]) -> SimStartupError:
    """Field-bound errors ``(field, value, pydantic type, text)``, all reported together."""
    body: list[str] = []
    for field, value, typ, text in bad:
        body += [
            field,
            f"  {text} [type={typ}, input_value={value!r}, input_type={type(value).__name__}]",
            f"{_PYDANTIC_URL}{typ}",
        ]
    return _config_error(cls_name, body, "", FailureClass.CONFIG_INVALID)


def validate_config(model: ModelProfile, args: ResolvedArgs) -> None:
    """Raise :class:`SimStartupError` for the first config vLLM 0.32 rejects, in vLLM's order."""
    mml, mns, mnbt = args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens
    if mml > model.max_position_embeddings:
        msg = (
            f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
            f"(max_position_embeddings={float(model.max_position_embeddings)} or "
            "model_max_length=None in model's config.json). To allow overriding this maximum, "
            "set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
            "must be used with extreme caution. If the model uses relative position encoding "
            "(RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses "
            "absolute position encoding, positions exceeding derived_max_model_len will cause "
            "a CUDA array out-of-bounds error."
        )
        raise _value_error(
            "ModelConfig",
            msg,
            [("model", model.name), ("max_model_len", mml), ("renderer_num_workers", 1)],
            FailureClass.MAXLEN_GT_MODEL,
        )
    util = args.gpu_memory_utilization
    cache_bad: list[tuple[str, object, str, str]] = []  # in CacheConfig's field order
    if args.block_size <= 0:
        cache_bad.append(
            ("block_size", args.block_size, "greater_than", "Input should be greater than 0")
        )
    if not util > 0:  # also catches NaN, as pydantic's gt=0 does
        cache_bad.append(
            ("gpu_memory_utilization", util, "greater_than", "Input should be greater than 0")
        )
    elif util > 1:
        cache_bad.append(
            (
                "gpu_memory_utilization",
                util,
                "less_than_equal",
                "Input should be less than or equal to 1",
            )
        )
    if cache_bad:
        raise _field_errors("CacheConfig", cache_bad)
    sched_bad = [
        (f, v, "greater_than_equal", "Input should be greater than or equal to 1")
        for f, v in (("max_num_batched_tokens", mnbt), ("max_num_seqs", mns))
        if v < 1
    ]
    if sched_bad:
        raise _field_errors("SchedulerConfig", list(sched_bad))
    items: list[tuple[str, object]] = [
        ("runner_type", "generate"),
        ("max_num_batched_tokens", mnbt),
        ("max_num_seqs", mns),
        ("max_model_len", mml),
        ("stream_interval", 1),
    ]
    if not args.enable_chunked_prefill and mnbt < mml:
        msg = (
            f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}). This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and "
            "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len."
        )
        raise _value_error("SchedulerConfig", msg, items, FailureClass.MNBT_LT_MAXLEN)
    if mnbt < mns:
        msg = (
            f"max_num_batched_tokens ({mnbt}) must be greater than or equal to "
            f"max_num_seqs ({mns})."
        )
        raise _value_error("SchedulerConfig", msg, items, FailureClass.MNBT_LT_MNS)
    tp = args.tensor_parallel_size
    tp_msg = model.tp_error(tp)
    if tp_msg is not None:
        raise _value_error(
            "VllmConfig",
            tp_msg,
            [("model_config", model.name), ("parallel_config", tp)],
            FailureClass.CONFIG_INVALID,
        )
