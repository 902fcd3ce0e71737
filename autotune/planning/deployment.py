"""A deployment of one engine config, replicated, run on the simulator
(docs/sizing.md#3-replicas-and-their-check).

Each replica is its own simulated server with its own workload sample at its share of the
target: ``rate / n`` requests/s on the study's arrival process, or its share of the
concurrent requests as a closed loop. A round-robin balancer hands each replica every n-th
request of one Poisson stream, which is smoother than an independent Poisson stream at the
same rate, so this check errs on the cautious side. :func:`max_streams` finds, by bisection,
the most closed-loop streams one replica keeps within the SLOs: a concurrency target's
per-replica capacity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.config import WorkloadConfig
from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.level import LevelMetrics
from autotune.planning.replicas import DeploymentRun, DeploymentRunner, Target, split_load
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, replay_level
from autotune.tuning.measure.scoring import Slo, score_level
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

__all__ = [
    "ReplicaRun",
    "ReplicaSetup",
    "deployment_runner",
    "judged",
    "max_streams",
    "per_user",
    "pooled_metrics",
    "replica_sample",
    "replica_seed",
    "run_replica",
]

# A closed loop's first round arrives at once, a prefill storm no steady population of users
# makes, and its last round drains with ever fewer in flight: both are cut, and the rounds
# between are the steady state the figures describe (docs/sizing.md#3-replicas-and-their-check)
_ROUNDS = 6
# samples per bisection step: a closed loop's steady state has a few hundred requests, whose
# p99 is their few worst, so a step's verdict is the majority of three draws
_SAMPLES = 3


@dataclass(frozen=True)
class ReplicaSetup:
    """One replica's server (model, hardware, engine args) and what it is judged by."""

    model: ModelProfile
    hardware: HardwareProfile
    args: EngineArgs
    workload: WorkloadConfig
    slo: Slo
    seed: int = 0
    jitter_cv: float = 0.015
    # a replica's sample is at least as long as a study's level (docs/tuning.md#13-level-length)
    min_requests: int = 0
    min_seconds: float = 0.0

    @property
    def load_slo(self) -> Slo:
        """The SLOs a replica count can change: the over-length rate comes from the lengths
        and ``max_model_len``, which no count changes (the study screened it), so it is
        left to the study (docs/sizing.md#3-replicas-and-their-check)."""
        return replace(self.slo, max_overlength_rate=1.0)


def replica_sample(setup: ReplicaSetup, target_kind: str, share: float, seed: int) -> Workload:
    """One replica's own sample at ``share`` of a ``target_kind`` target."""
    w = setup.workload.model_dump()
    w["seed"] = seed
    least = max(int(w["num_prompts"]), setup.min_requests)
    if target_kind == "rate":
        w["rate"] = share
        if w["arrival"] in ("closed", "all-at-once", "trace"):
            w["arrival"] = "poisson"  # a rate target is an open loop
        w["concurrency"] = None
        w["num_prompts"] = max(least, math.ceil(share * setup.min_seconds))
    else:
        streams = int(share)
        w.update(arrival="closed", concurrency=streams, rate=None)
        w["num_prompts"] = max(least, _ROUNDS * streams)
    return build_workload(WorkloadConfig.model_validate(w), vocab_size=setup.model.vocab_size)


@dataclass(frozen=True)
class ReplicaRun:
    """One replica's measured requests (a closed loop's steady state: its first and last
    rounds cut) and its whole sample's request counts."""

    records: tuple[RequestRecord, ...]
    completed: int
    failed: int
    over_length: int
    truncated: int


def run_replica(setup: ReplicaSetup, target_kind: str, share: float, seed: int) -> ReplicaRun:
    """One replica at ``share`` of a ``target_kind`` target, on its own sample ``seed``."""
    level = replay_level(
        setup.model,
        setup.hardware,
        setup.args,
        replica_sample(setup, target_kind, share, seed),
        seed=seed,
        jitter_cv=setup.jitter_cv,
        warmup=setup.workload.warmup,
    )
    full = LevelMetrics.from_summary(level.summary, level.stop)
    recs = sorted(level.records, key=lambda r: r.sent_at if r.sent_at is not None else 0.0)
    if target_kind == "concurrency":
        streams = int(share)
        recs = recs[streams : len(recs) - streams] or recs
    return ReplicaRun(tuple(recs), full.completed, full.failed, full.over_length, full.truncated)


def pooled_metrics(runs: Sequence[ReplicaRun]) -> LevelMetrics:
    """The deployment's figures: every replica's requests in one set, as the users behind
    the balancer see them (percentiles of the pool, throughput of all replicas together over
    the longest replica's window). Latencies and throughput are the measured windows'; the
    error and over-length rates are the whole samples': they come from the lengths, not
    from the load."""
    recs = [r for run in runs for r in run.records]
    windows = [_window(run.records) for run in runs]
    m = LevelMetrics.from_summary(summarize(recs, max(windows, default=0.0) or 1e-9), None)
    return replace(
        m,
        completed=sum(r.completed for r in runs),
        failed=sum(r.failed for r in runs),
        over_length=sum(r.over_length for r in runs),
        truncated=sum(r.truncated for r in runs),
    )


def _window(records: Sequence[RequestRecord]) -> float:
    sent = [r.sent_at for r in records if r.sent_at is not None]
    return max(r.finished_at for r in records) - min(sent) if sent else 0.0


def per_user(m: LevelMetrics) -> float | None:
    """Output tok/s one user sees: the inverse of the median TPOT."""
    tpot: Any = m.summary.get("median_tpot_ms")
    return 1000.0 / float(tpot) if isinstance(tpot, int | float) and tpot > 0 else None


def replica_seed(setup: ReplicaSetup, n: int, i: int = 0) -> int:
    """The sample seed of replica ``i`` when the check runs ``n`` replicas: each replica of
    each count draws its own sample."""
    return setup.seed + 7919 * n + i


def deployment_runner(setup: ReplicaSetup, target: Target) -> DeploymentRunner:
    """Runs ``n`` replicas of ``setup`` at their shares of ``target``; each replica of each
    count draws its own sample, and the SLOs are judged on the pooled requests."""

    def run(n: int) -> DeploymentRun:
        shares = split_load(target, n)
        runs = [
            run_replica(setup, target.kind, share, replica_seed(setup, n, i))
            for i, share in enumerate(shares)
        ]
        return judged(n, pooled_metrics(runs), setup)

    return run


def judged(n: int, m: LevelMetrics, setup: ReplicaSetup, copies: int = 1) -> DeploymentRun:
    """``n`` replicas whose requests measured ``m``, judged by ``setup``'s SLOs; ``copies``:
    how many replicas ``m`` stands for (one replica measured for all ``n``: its output tok/s
    times ``n``)."""
    score = score_level(m, setup.load_slo)
    return DeploymentRun(
        replicas=n,
        meets=score.feasible,
        p99_ttft_ms=m.p99_ttft_ms,
        p99_tpot_ms=m.p99_tpot_ms,
        output_tps=m.output_throughput * copies,
        tps_per_user=per_user(m),
        broken=tuple(score.texts),
    )


def max_streams(setup: ReplicaSetup, ceiling: int) -> int:
    """The most closed-loop streams (1 to ``ceiling``) one replica keeps within the SLOs;
    0 when even one stream misses them. Bisection, each step the majority of
    :data:`_SAMPLES` samples, feasibility assumed monotone in the streams (more streams:
    longer queues and larger batches)."""

    def ok(c: int) -> bool:  # the majority of _SAMPLES samples: one sample's p99 is noisy
        held = 0
        for k in range(_SAMPLES):
            run = run_replica(setup, "concurrency", c, setup.seed + 104729 * k)
            held += score_level(pooled_metrics([run]), setup.load_slo).feasible
            if held > _SAMPLES // 2 or held + (_SAMPLES - 1 - k) <= _SAMPLES // 2:
                break  # decided
        return held > _SAMPLES // 2

    if ceiling < 1 or not ok(1):
        return 0
    lo, hi = 1, ceiling
    if ok(hi):
        return hi
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
