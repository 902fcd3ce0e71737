"""How many devices one vLLM server holds: the product of its parallel sizes
(docs/parallel.md#2-lanes), or the devices it was given. One owner for the rule:
the lanes size themselves with it and the cost counts device-seconds with it
(docs/cost.md#1-what-is-counted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["PARALLEL_FLAGS", "devices_held", "flag_name", "world_size"]

# vLLM's flags whose product is the number of devices one server uses
PARALLEL_FLAGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def flag_name(name: str) -> str:
    """``--tensor-parallel-size`` or ``tensor-parallel-size`` as ``tensor_parallel_size``."""
    return name.lstrip("-").replace("-", "_")


def world_size(args: Mapping[str, Any]) -> int | None:
    """The devices one server with ``args`` uses (tensor x pipeline x data parallel sizes),
    None when none of them is set."""
    sizes = [v for k, v in args.items() if flag_name(k) in PARALLEL_FLAGS and v is not None]
    if not sizes:
        return None
    n = 1
    for v in sizes:
        n *= int(v)
    return n


def devices_held(args: Mapping[str, Any], gpus: str | None = None) -> int:
    """The devices a server with ``args`` (engine and static args together) holds while it
    lives: those it was given (``CUDA_VISIBLE_DEVICES``, a comma list) when set, else the
    product of its parallel sizes, else 1."""
    if gpus:
        return len([g for g in gpus.split(",") if g.strip()])
    return world_size(args) or 1
