"""What ``autotune study status`` shows: who runs a study right now
(docs/faults.md#8-autotune-study-status)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import optuna
from optuna.trial import TrialState

from autotune.config import StudyConfig
from autotune.errors import ConfigError
from autotune.store import Store
from autotune.store.fleet import ControllerEntry
from autotune.tuning import attrs, study_attrs
from autotune.tuning.run.create import load_study_config
from autotune.tuning.run.gpu_budget import CostEstimate, estimate, simulated_capacity
from autotune.tuning.search.edges import Widening, apply_widenings, stored_widenings
from autotune.tuning.search.home_size import home_trial, size_of
from autotune.tuning.search.plan import model_of
from autotune.tuning.search.ranking import feasible_ranked
from autotune.tuning.search.space import SpaceBounds
from autotune.tuning.search.stages import plan_lines
from autotune.tuning.search.strategy import MEASURED, planned_total
from autotune.workload.build import study_workload

__all__ = ["RunningTrial", "StudyStatus", "plan_estimate", "study_plan", "study_status"]


@dataclass(frozen=True)
class RunningTrial:
    number: int
    stage: str
    controller: str  # host:pid of the claiming controller
    workers: str  # its live worker process groups
    started: datetime | None
    devices: str | None = None  # its worker's CUDA_VISIBLE_DEVICES (docs/parallel.md)


@dataclass
class StudyStatus:
    controllers: list[ControllerEntry]
    running: list[RunningTrial]
    claims: int
    open_claims: int
    waiting: int
    complete: int
    failed: int
    planned: int
    retries: list[str] = field(default_factory=list)
    # of the complete ones, the trials settled below the best so far
    # (docs/tuning.md#14-settling-losing-trials)
    settled: int = 0


def study_status(store: Store, name: str) -> StudyStatus:
    rec = store.get_study(name)
    assert rec is not None, "check the study exists first"
    fleet = store.fleet()
    controllers = fleet.controllers(name)
    by_id = {c.id: c for c in controllers}
    claims = fleet.claims(name)
    claim_of = {c.trial_number: c for c in claims if c.trial_number is not None}
    workers = fleet.workers(name)
    study = optuna.load_study(study_name=rec.optuna_study_name, storage=store.optuna_storage())
    trials = study.get_trials(deepcopy=False)
    running: list[RunningTrial] = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        claim = claim_of.get(t.number)
        owner = by_id.get(claim.controller_id) if claim and claim.controller_id else None
        groups = [
            f"{w.pgid}@{w.host}"
            for w in workers
            if w.trial_name == f"trial-{t.number:04d}"
            and (owner is None or w.controller_id == owner.id)
        ]
        running.append(
            RunningTrial(
                number=t.number,
                stage=attrs.stage_of(t) or "?",
                controller=f"{owner.host}:{owner.pid}" if owner else "(unclaimed)",
                workers=", ".join(groups),
                started=t.datetime_start,
                devices=attrs.devices_of(t),
            )
        )
    retries = []
    for t in trials:
        history = attrs.retry_history(t)
        if history:
            retries.append(
                f"trial {t.number} ({attrs.stage_of(t) or '?'}) retries trial "
                f"{history[-1]}: {t.state.name}"
            )
    cfg = load_study_config(rec)
    bounds = study_attrs.read_header(study).bounds
    return StudyStatus(
        controllers=controllers,
        running=running,
        claims=len(claims),
        open_claims=sum(1 for c in claims if c.released_at is None),
        waiting=sum(1 for t in trials if t.state == TrialState.WAITING),
        complete=sum(1 for t in trials if t.state in MEASURED),  # settled ones too
        failed=sum(1 for t in trials if t.state == TrialState.FAIL),
        planned=planned_total(cfg.strategy, bounds, 1 + len(cfg.enqueue), trials),
        retries=retries,
        settled=sum(1 for t in trials if t.state == TrialState.PRUNED),
    )


@dataclass(frozen=True)
class _Plan:
    """What a study's plan is read from, loaded once."""

    cfg: StudyConfig
    header: study_attrs.StudyHeader
    bounds: SpaceBounds  # with the passes' widenings
    widened: list[Widening]
    trials: list[optuna.trial.FrozenTrial]
    simulated: float | None  # the baseline's capacity as `study create` simulated it


def _load_plan(store: Store, name: str) -> _Plan:
    rec = store.get_study(name)
    assert rec is not None, "check the study exists first"
    study = optuna.load_study(study_name=rec.optuna_study_name, storage=store.optuna_storage())
    header = study_attrs.read_header(study)
    widened = stored_widenings(study)  # edges moved out by the passes so far
    bounds = apply_widenings(header.bounds, widened)
    trials = study.get_trials(deepcopy=False)
    return _Plan(
        load_study_config(rec),
        header,
        bounds,
        widened,
        trials,
        simulated_capacity(rec.workload_profile),
    )


def study_plan(store: Store, name: str) -> list[str]:
    """The study's plan as of now (docs/tuning.md#8-the-staged-plan): the candidates dropped
    before any launch, each stage's budget with the reason the baseline gave for it, and its
    device time (docs/cost.md#3-the-plan-and-the-budget)."""
    p = _load_plan(store, name)
    lines = plan_lines(p.trials, p.cfg.strategy, p.bounds, p.header.screening)
    return lines + [w.line() for w in p.widened] + _cost_line(p)


def plan_estimate(store: Store, name: str) -> CostEstimate | None:
    """The device time of study ``name``'s plan as of now (docs/cost.md#3-the-plan-and-the-budget);
    None when its workload cannot be read any more (its file moved)."""
    return _estimate(_load_plan(store, name))


def _estimate(p: _Plan) -> CostEstimate | None:
    cfg = p.cfg
    model = model_of(cfg)
    try:
        wl = study_workload(
            cfg, vocab_size=model.vocab_size, expect_fingerprint=p.header.workload_fingerprint
        )
    except ConfigError:
        return None
    planned = planned_total(cfg.strategy, p.bounds, 1 + len(cfg.enqueue), p.trials)
    # once a trial has held the SLOs, a study that searches the parallelism is priced at the
    # size the later stages tune (before, at the largest size)
    home = home_trial(p.trials) if p.bounds.parallel and feasible_ranked(p.trials) else None
    size = size_of(home) if home is not None else None
    return estimate(cfg, model, wl, planned, size, p.simulated)


def _cost_line(p: _Plan) -> list[str]:
    """The plan's device time, and the budget if one is set."""
    est = _estimate(p)
    if est is None:
        return []
    line = est.text
    if p.cfg.strategy.gpu_hours is not None:
        line += f"; budget {p.cfg.strategy.gpu_hours:g} GPU-hours (strategy.gpu_hours)"
    return [line]
