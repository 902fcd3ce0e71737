"""Replica arithmetic and the replicated check (docs/sizing.md#3-replicas-and-their-check).

A target is a peak request rate or a peak number of concurrent requests. One replica of the
best config serves ``per_replica`` of it (its SLO capacity in req/s, or the most closed-loop
streams it keeps within the SLOs); the deployment needs ``ceil(target / per_replica)``
replicas. The check then runs the deployment itself: ``n`` replicas behind round-robin, each
with its own sample at its share of the target, must all meet the SLOs, and ``n - 1`` must
not. When ``n - 1`` also meets them the figure is conservative; when ``n`` misses them the
count was optimistic and the next count up is tried. Pure: the deployment's runner is
injected (:class:`DeploymentRunner`), so a scripted runner tests the rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_EXTRA_REPLICAS",
    "DeploymentRun",
    "DeploymentRunner",
    "ReplicaCheck",
    "Target",
    "check_replicas",
    "replicas_needed_for",
    "split_load",
]

# How far the check raises a count the SLOs rejected before it gives up on the row: the
# study's capacity is a measured figure, so a miss by more than this is a wrong capacity,
# not noise (docs/sizing.md#3-replicas-and-their-check).
MAX_EXTRA_REPLICAS = 3


@dataclass(frozen=True)
class Target:
    """What the deployment must serve: ``rate`` requests/s (open loop) or ``concurrency``
    requests in flight (closed loop)."""

    kind: Literal["rate", "concurrency"]
    value: float

    def __post_init__(self) -> None:
        if not (self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"target {self.kind} must be a positive number, got {self.value}")
        if self.kind == "concurrency" and self.value != int(self.value):
            raise ValueError(f"target concurrency must be a whole number, got {self.value}")

    @property
    def text(self) -> str:
        if self.kind == "rate":
            return f"{self.value:g} req/s"
        return f"{int(self.value)} concurrent requests"


def replicas_needed_for(target: Target, per_replica: float) -> int:
    """Replicas of a config that serve ``target`` when one serves ``per_replica`` of it."""
    if not (per_replica > 0 and math.isfinite(per_replica)):
        raise ValueError(f"a replica's capacity must be positive, got {per_replica}")
    # 1e-9: a capacity that is exactly the target's share needs no extra replica
    return max(1, math.ceil(target.value / per_replica - 1e-9))


def split_load(target: Target, n: int) -> list[float]:
    """Each of ``n`` round-robin replicas' share: ``rate / n`` each, or the streams dealt
    out one by one (some replicas get one more), never an empty replica."""
    if n < 1:
        raise ValueError(f"replicas must be >= 1, got {n}")
    if target.kind == "rate":
        return [target.value / n] * n
    c = int(target.value)
    if n > c:
        raise ValueError(f"{n} replicas cannot share {c} concurrent requests")
    base, extra = divmod(c, n)
    return [float(base + (1 if i < extra else 0)) for i in range(n)]


@dataclass(frozen=True)
class DeploymentRun:
    """``replicas`` replicas, each run at its share of the target: ``meets`` when every one
    kept the SLOs. The figures are the worst replica's latencies, the deployment's output
    tokens/s (all replicas) and the median replica's output tokens/s per request (what one
    user sees). ``broken``: the worst replica's violations, in words."""

    replicas: int
    meets: bool
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    output_tps: float
    tps_per_user: float | None
    broken: tuple[str, ...] = ()


DeploymentRunner = Callable[[int], DeploymentRun]


@dataclass(frozen=True)
class ReplicaCheck:
    """The replicated check of a count: ``at_n`` (the count kept), ``below`` (``n - 1``
    replicas; None when ``n`` is 1) and ``first`` (the arithmetic's count, when the check
    had to raise it)."""

    at_n: DeploymentRun
    below: DeploymentRun | None
    first: int

    @property
    def replicas(self) -> int:
        return self.at_n.replicas

    @property
    def verdict(self) -> Literal["holds", "conservative", "fails"]:
        """``holds``: n meet the SLOs and n - 1 do not (or n is 1); ``conservative``:
        n - 1 meet them too; ``fails``: even the raised count missed them."""
        if not self.at_n.meets:
            return "fails"
        if self.below is not None and self.below.meets:
            return "conservative"
        return "holds"

    @property
    def text(self) -> str:
        n = self.replicas
        if self.verdict == "fails":
            why = "; ".join(self.at_n.broken) or "the SLOs"
            return f"fails: {n} replicas still miss the SLOs ({why})"
        raised = (
            f" (raised from {self.first}: one replica's capacity was optimistic)"
            if n != self.first
            else ""
        )
        if self.verdict == "conservative":
            return f"conservative: {n - 1} replicas also meet the SLOs{raised}"
        if self.below is None:
            return f"holds: 1 replica meets the SLOs{raised}"
        return f"holds: {n} replicas meet the SLOs, {n - 1} do not{raised}"


def check_replicas(
    n: int, run: DeploymentRunner, *, max_replicas: int | None = None
) -> ReplicaCheck:
    """Check ``n`` replicas with ``run``; a count that misses the SLOs is raised one at a time
    (at most :data:`MAX_EXTRA_REPLICAS`, and never past ``max_replicas``, the most the
    target can be split into), then ``n - 1`` of the count kept is run too."""
    if n < 1:
        raise ValueError(f"replicas must be >= 1, got {n}")
    top = (
        n + MAX_EXTRA_REPLICAS
        if max_replicas is None
        else min(n + MAX_EXTRA_REPLICAS, max_replicas)
    )
    runs: dict[int, DeploymentRun] = {}

    def once(k: int) -> DeploymentRun:  # a raised count's n - 1 was already run
        if k not in runs:
            runs[k] = run(k)
        return runs[k]

    k = n
    at = once(k)
    while not at.meets and k < top:
        k += 1
        at = once(k)
    below = once(k - 1) if k > 1 and at.meets else None
    return ReplicaCheck(at, below, n)
