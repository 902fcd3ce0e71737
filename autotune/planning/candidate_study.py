"""One short study per GPU type and tensor-parallel size (docs/sizing.md#1-what-it-does).

Each candidate is the user's study config with its ``hardware`` and
``worker.static_args.tensor_parallel_size`` set, ``strategy.n_trials`` cut to the size run's
budget (the staged plan's stages shortened to match) and the validation phase off: the
replicated check re-runs the winner at the deployment's real load
(:mod:`autotune.planning.deployment`), which is the verdict a size needs. Its best config, its
capacity and what the study cost come back as a :class:`CandidateResult`; a candidate that
cannot run (weights that do not fit a rank, no feasible config) comes back with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from autotune.config import StudyConfig, parse_config
from autotune.errors import AutotuneError
from autotune.report.recommend import recommend
from autotune.store import Store
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import OnEvent

__all__ = ["CandidateResult", "candidate_config", "run_candidate"]

# the load scales a candidate's capacity search spans at least (the workload's rate times)
_CAPACITY_LOW = 0.05
_CAPACITY_HIGH = 10.0


@dataclass(frozen=True)
class CandidateResult:
    """A candidate's short study: its best engine args and ``vllm serve`` command, one
    replica's SLO capacity in req/s (``capacity_bound`` "≥" when the search hit the top of
    its range) and output tok/s there, the study's device-seconds, or ``failure``."""

    hardware: str
    tensor_parallel_size: int
    study: str
    config: StudyConfig
    engine_args: dict[str, Any] | None = None
    command: str | None = None
    capacity_rps: float | None = None
    capacity_bound: str = ""
    output_tps: float | None = None
    study_gpu_s: float = 0.0
    failure: str | None = None


def candidate_config(
    base: StudyConfig, hardware: str, tp: int, trials: int, worker: str = "sim-virtual"
) -> StudyConfig:
    """The user's config as one candidate's short study on ``worker`` (``sim-virtual``
    plans on the simulator; ``vllm`` keeps the config's real worker section)."""
    text = _candidate_text(base, hardware, tp, trials, worker)
    return parse_config(text, f"{base.name} ({hardware}, TP {tp})")


def _candidate_text(base: StudyConfig, hardware: str, tp: int, trials: int, worker: str) -> str:
    """The candidate's study config as YAML (what its study stores)."""
    d = base.model_dump(mode="json", by_alias=True, exclude_unset=True)
    d["name"] = f"{base.name}-size-{hardware}-tp{tp}"[:100]
    d["hardware"] = hardware
    d.pop("storage", None)
    section = d.setdefault("worker", {})
    section["kind"] = worker
    section["static_args"] = {**section.get("static_args", {}), "tensor_parallel_size": tp}
    strategy = d.setdefault("strategy", {})
    strategy["n_trials"] = trials
    if base.strategy.name == "staged":
        # the fixed order's four stages each get a share, the rest goes to joint refinement
        per_stage = max(1, (trials - 1) // 5)
        strategy["trials_per_stage"] = per_stage
        strategy["joint_refinement"] = max(0, trials - 1 - 4 * per_stage)
    strategy["validate"] = {**strategy.get("validate", {}), "enabled": False}
    # one replica of a small GPU may serve a twentieth of the workload's rate, and one of a
    # wide TP group ten times it: both are rows, so the capacity search spans both, unless
    # the config sets an end (a host that cannot drive ten times the rate against a real
    # worker is told to lower capacity_high: that advice must be one it can follow)
    if "capacity_low" not in strategy:
        strategy["capacity_low"] = min(base.strategy.capacity_low, _CAPACITY_LOW)
    if "capacity_high" not in strategy:
        strategy["capacity_high"] = max(base.strategy.capacity_high, _CAPACITY_HIGH)
    return yaml.safe_dump(d, sort_keys=False)


def run_candidate(
    base: StudyConfig,
    hardware: str,
    tp: int,
    trials: int,
    store: Store,
    *,
    worker: str = "sim-virtual",
    on_event: OnEvent | None = None,
) -> CandidateResult:
    """Create and run one candidate's study in ``store``; errors become the row's reason."""
    text = _candidate_text(base, hardware, tp, trials, worker)
    cfg = parse_config(text, f"{base.name} ({hardware}, TP {tp})")
    row = CandidateResult(hardware, tp, cfg.name, cfg)
    try:
        if store.get_study(cfg.name) is None:
            create_study(cfg, text, store)
        run_study(cfg.name, store, on_event=on_event)
    except AutotuneError as exc:
        return _with(row, failure=str(exc).splitlines()[0], store=store)
    trials_ = store.trials(cfg.name)
    rec = recommend(cfg, trials_)
    gpu_s = study_cost(trials_).gpu_s
    if rec is None:
        return _with(row, failure="no feasible config in the study", store=store)
    cap = rec.capacity()
    rps = cap.rps if cap is not None else None
    if rps is None or not math.isfinite(rps) or rps <= 0:
        return _with(row, failure="the best config has no measured capacity", store=store)
    lv = rec.trial.headline_level()
    return CandidateResult(
        hardware,
        tp,
        cfg.name,
        cfg,
        engine_args=dict(rec.engine_args),
        command=rec.command,
        capacity_rps=rps,
        capacity_bound=cap.bound if cap is not None else "",
        output_tps=lv.output_throughput if lv is not None else None,
        study_gpu_s=gpu_s,
    )


def _with(row: CandidateResult, *, failure: str, store: Store) -> CandidateResult:
    trials = store.trials(row.study) if store.get_study(row.study) is not None else []
    return CandidateResult(
        row.hardware,
        row.tensor_parallel_size,
        row.study,
        row.config,
        study_gpu_s=study_cost(trials).gpu_s,
        failure=failure,
    )
