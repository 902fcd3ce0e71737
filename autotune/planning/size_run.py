"""``autotune size``: every GPU type and tensor-parallel candidate, each tuned by a short
study, sized for the target and checked as a replicated deployment (docs/sizing.md).

Per candidate: :func:`~autotune.planning.candidate_study.run_candidate` finds its best config and
one replica's SLO capacity; for a concurrency target, :func:`max_streams` measures how many
closed-loop streams that config keeps within the SLOs instead; the replica count follows,
and :func:`~autotune.planning.replicas.check_replicas` runs it: on the simulator (the hardware
profile of the row), which plays the replicas the user does not have yet, or with a real
worker on one replica of it at each count's share (:mod:`autotune.planning.real_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from autotune.config import StudyConfig
from autotune.errors import AutotuneError
from autotune.planning.candidate_study import CandidateResult, run_candidate
from autotune.planning.deployment import ReplicaSetup, deployment_runner, max_streams
from autotune.planning.prices import Prices
from autotune.planning.real_check import RealReplica
from autotune.planning.replicas import Target, check_replicas, replicas_needed_for
from autotune.planning.size_table import SizeReport, SizeRow, build_row, rank_rows
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, hardware_of, sim_engine_args
from autotune.store import Store
from autotune.tuning.measure.scoring import Slo
from autotune.tuning.run.controller import study_workdir
from autotune.tuning.search.parallelism import tp_candidates
from autotune.tuning.search.plan import model_of

__all__ = ["DEVICES_PER_NODE", "measured_node", "replica_setup", "size_deployment", "size_row"]

# a TP group stays on one node; eight GPUs is the common node (HGX, DGX, p5/a3 instances)
DEVICES_PER_NODE = 8


def measured_node(per_node: int, found: int) -> int:
    """The largest TP group ``--worker vllm`` can launch on this host: ``per_node``, but no
    more than the ``found`` devices (0: no GPU found, where vLLM runs on one device, its CPU
    backend's). A real candidate larger than the host fails at startup after minutes of
    loading, so it is not tried (docs/sizing.md#9-on-real-workers)."""
    return max(1, min(per_node, found or 1))


def replica_setup(
    cfg: StudyConfig, model: ModelProfile, hardware: str, args: EngineArgs
) -> ReplicaSetup:
    """One replica of ``args`` on ``hardware``, judged by ``cfg``'s SLOs, sampled from its
    workload with a study's level length (docs/sizing.md#3-replicas-and-their-check)."""
    return ReplicaSetup(
        model,
        hardware_of(hardware),
        args,
        cfg.workload,
        Slo.of(cfg.slo),
        seed=cfg.seed,
        jitter_cv=cfg.worker.jitter_cv,
        min_requests=cfg.strategy.min_level_requests,
        min_seconds=cfg.strategy.min_level_s,
    )


def size_row(
    cfg: StudyConfig,
    model: ModelProfile,
    c: CandidateResult,
    target: Target,
    prices: Prices,
    real: Path | None = None,
) -> SizeRow:
    """Candidate ``c`` sized for ``target`` and checked as a replicated deployment: on the
    simulator, or with ``real`` (a work folder) on one real replica of its config
    (docs/sizing.md#9-on-real-workers)."""
    if c.failure is not None or c.engine_args is None or c.capacity_rps is None:
        return build_row(c, None, None, prices)
    args = sim_engine_args(c.engine_args, c.config.worker.static_args)
    setup = replica_setup(cfg, model, c.hardware, args)
    ceiling: int | None = None
    if target.kind == "rate":
        per_replica = c.capacity_rps
    else:
        ceiling = int(target.value)
        per_replica = float(max_streams(setup, ceiling))
        if per_replica == 0:
            return build_row(c, 0.0, None, prices, "one closed-loop stream already misses the SLOs")
    n = replicas_needed_for(target, per_replica)
    if real is None:
        check = check_replicas(n, deployment_runner(setup, target), max_replicas=ceiling)
        return build_row(c, per_replica, check, prices)
    replica = RealReplica(c, model, setup, real)
    kind = c.config.worker.kind
    try:
        with replica:
            check = check_replicas(n, replica.runner(target), max_replicas=ceiling)
        row = build_row(c, per_replica, check, prices)
    except AutotuneError as exc:
        why = f"the replica check on {kind}: {str(exc).splitlines()[0]}"
        row = build_row(c, per_replica, None, prices, why)
    # what the check's worker cost counts with the candidate's study (docs/cost.md)
    return replace(row, study_gpu_s=row.study_gpu_s + replica.gpu_s, check_on=kind)


def size_deployment(
    cfg: StudyConfig,
    target: Target,
    hardware: Sequence[str],
    trials: int,
    prices: Prices,
    store: Store,
    *,
    worker: str = "sim-virtual",
    devices_per_node: int = DEVICES_PER_NODE,
    progress: Callable[[SizeRow], None] | None = None,
) -> SizeReport:
    """The ranked table for ``target`` over ``hardware`` x the model's TP candidates."""
    model = model_of(cfg)
    rows: list[SizeRow] = []
    for hw in hardware:
        for tp in tp_candidates(model, devices_per_node):
            c = run_candidate(cfg, hw, tp, trials, store, worker=worker)
            # the check's worker runs where the study's did
            real = study_workdir(c.config, c.study) if worker == "vllm" else None
            row = size_row(cfg, model, c, target, prices, real)
            rows.append(row)
            if progress is not None:
                progress(row)
    ranked, by = rank_rows(rows)
    unpriced = (
        sorted({r.hardware for r in ranked if r.usable and r.price_per_gpu_hour is None})
        if prices
        else []
    )
    slo = cfg.slo.model_dump(mode="json")
    return SizeReport(cfg.name, target, slo, worker, ranked, by, unpriced)
