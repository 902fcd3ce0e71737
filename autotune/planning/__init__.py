"""Planning a deployment: how many GPUs, which tensor parallelism, what it costs
(docs/sizing.md). ``autotune size`` runs a short study per GPU type and tensor-parallel
candidate, turns each best config into the replicas a target rate or concurrency needs,
checks that count by simulating the replicated deployment, and prices it with the user's own
prices."""

from __future__ import annotations

from autotune.planning.prices import Prices, parse_price_flags, read_prices
from autotune.planning.replicas import (
    DeploymentRun,
    ReplicaCheck,
    Target,
    check_replicas,
    replicas_needed_for,
    split_load,
)

__all__ = [
    "DeploymentRun",
    "Prices",
    "ReplicaCheck",
    "Target",
    "check_replicas",
    "parse_price_flags",
    "read_prices",
    "replicas_needed_for",
    "split_load",
]
