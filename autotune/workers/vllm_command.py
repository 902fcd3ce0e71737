"""``vllm serve`` command lines: built from engine args the way ``vllm serve`` spells flags
(docs/vllm.md#8-command-line-and-readiness), and shell-quoted with secrets masked for storing,
so a result can be reproduced by pasting its command."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.profiles.flags import strip_sim_flags
from autotune.redact import mask_argv

__all__ = ["TUNED_ORDER", "deploy_argv", "flag_key", "format_command", "vllm_argv"]

# The tuned knobs lead, in this order, so stored commands of one study line up when read.
TUNED_ORDER = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")
_RESERVED = ("model", "host", "port", "served_model_name")


def flag_key(name: str) -> str:
    """An engine arg's name as a key: ``--max-num-seqs`` and ``max-num-seqs`` are
    ``max_num_seqs``."""
    return name.lstrip("-").replace("-", "_")


def _flag_args(key: str, value: Any) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):  # before int: bool is an int
        return [flag] if value else ["--no-" + flag[2:]]
    if isinstance(value, Mapping):  # vLLM reads dict-valued args (--compilation-config) as JSON
        return [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError(f"{flag}: an empty list cannot be written as a flag")
        return [flag, *(str(v) for v in value)]  # nargs="+" style, as --served-model-name
    return [flag, str(value)]


def vllm_argv(
    executable: Sequence[str],
    model: str,
    engine_args: Mapping[str, Any],
    *,
    static_args: Mapping[str, Any] | None = None,
    host: str | None = None,
    port: int | None = None,
    served_model_name: str | None = None,
) -> list[str]:
    """``executable + ["serve", model, flags...]``.

    Engine args come first (the tuned four in :data:`TUNED_ORDER`, the rest sorted), then
    static args in their given order, then ``--host``/``--port`` (a worker's; a command for
    people leaves them to the deployment) and ``--served-model-name``.
    ``snake_case`` becomes ``--kebab-case``; True ``--flag``, False ``--no-flag``, None is
    left out, lists become ``--flag a b``, mappings JSON. A flag given twice is an error:
    argparse would silently keep the last one.
    """
    engine = {flag_key(k): v for k, v in engine_args.items()}
    static = {flag_key(k): v for k, v in (static_args or {}).items()}
    clash = sorted(
        (engine.keys() & static.keys()) | ((engine.keys() | static.keys()) & set(_RESERVED))
    )
    if clash:
        raise ValueError(f"flags given twice or reserved for the worker: {', '.join(clash)}")
    ordered = [k for k in TUNED_ORDER if k in engine]
    ordered += sorted(k for k in engine if k not in TUNED_ORDER)
    argv = [*executable, "serve", model]
    for k in ordered:
        argv += _flag_args(k, engine[k])
    for k, v in static.items():
        argv += _flag_args(k, v)
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if served_model_name is not None:
        argv += ["--served-model-name", served_model_name]
    return argv


def deploy_argv(
    model: str,
    engine_args: Mapping[str, Any],
    *,
    static_args: Mapping[str, Any] | None = None,
    served_model_name: str | None = None,
) -> list[str]:
    """The ``vllm serve`` command a user deploys a tuned config with: host and port left to
    the deployment, the simulator-only flags (docs/simulator.md) dropped."""
    return vllm_argv(
        ["vllm"],
        model,
        engine_args,
        static_args=strip_sim_flags(static_args or {}),
        served_model_name=served_model_name,
    )


def format_command(argv: Sequence[str]) -> str:
    """The shell-quoted command, for storing and printing (``shlex.split`` round-trips),
    with the values of secret flags (``--api-key``) and URL passwords masked."""
    return shlex.join(mask_argv(argv))
