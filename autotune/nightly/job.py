"""``autotune nightly``: one idempotent job per deployment (docs/nightly.md).

Refresh the workload, detect drift against the profile behind the current config, create a
dated study warm-started from the incumbent and the previous study's top configs (skipped
with ``skip_if_no_drift`` when nothing drifted), promote or keep, record the decision and
write the output file. Held under the deployment's lock. Run again the same day, it resumes
the dated study, or re-emits the decision already made for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import NotFoundError
from autotune.gitrecord.run_hooks import HOOKS
from autotune.gitrecord.study_record import record_commit
from autotune.nightly.decide import EXIT_KEEP, EXIT_PROMOTED, decide
from autotune.nightly.drift import Drift, TrafficProfile, detect_drift
from autotune.nightly.job_config import NightlyConfig
from autotune.nightly.job_lock import held_lock
from autotune.nightly.job_records import DecisionRecord, add_decision, decisions
from autotune.nightly.output import decision_commit, serve_command, write_output
from autotune.nightly.refresh import Refresh, refresh
from autotune.nightly.warmstart import create_warm_study, today_bounds
from autotune.store import Store
from autotune.tuning.measure.interval import summary_of
from autotune.tuning.measure.validate import candidates_of
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import load_study_config
from autotune.tuning.run.events import OnEvent
from autotune.tuning.search.plan import model_of
from autotune.tuning.study_attrs import stored_noise

__all__ = ["NightlyResult", "current_config", "rollback", "run_nightly", "study_config_for"]

log = logging.getLogger(__name__)


@dataclass
class NightlyResult:
    decision: DecisionRecord
    drift: Drift | None
    skipped: bool = False
    resumed: bool = False
    warnings: list[str] = field(default_factory=list)
    output_written: bool = True  # False: writing the output file failed (one warning)

    @property
    def exit_code(self) -> int:
        return self.decision.exit_code


def _lock_busy(deployment: str) -> str:
    return (
        f"a nightly run of deployment {deployment!r} is already running (it holds the "
        "deployment's lock); this run changed nothing"
    )


def study_config_for(cfg: NightlyConfig, name: str, workload: Mapping[str, Any]) -> StudyConfig:
    """The dated study's config: the nightly config's model, worker, SLOs and space, today's
    workload, the reduced budget, validation on."""
    st = cfg.strategy.model_dump(by_alias=True)
    b = cfg.budget
    st.update(
        n_trials=b.n_trials,
        trials_per_stage=b.trials_per_stage,
        timeout_s=b.timeout_s,
        joint_refinement=0,
    )
    st["validate"] = {
        **st["validate"],
        "enabled": True,
        "top_k": b.validate_top_k,
        "repeats": b.repeats,
    }
    return StudyConfig.model_validate(
        {
            "name": name,
            "model": cfg.model.model_dump(),
            "hardware": cfg.hardware,
            "worker": cfg.worker.model_dump(),
            "workload": dict(workload),
            "slo": cfg.slo.model_dump(),
            "mode": cfg.mode,
            "search": cfg.search.model_dump(),
            "strategy": st,
            "telemetry": cfg.telemetry.model_dump(),
            "record": cfg.record.model_dump(),
            "seed": cfg.seed,
        }
    )


def current_config(history: list[DecisionRecord]) -> dict[str, Any] | None:
    return dict(history[-1].deployed) if history else None


def _reference_profile(history: list[DecisionRecord]) -> TrafficProfile | None:
    """The profile behind the config in use: the day it was promoted (or, never promoted,
    the first day's)."""
    with_profile = [d for d in history if d.profile]
    if not with_profile:
        return None
    promoted = [d for d in with_profile if d.decision in ("promote", "rollback") and not d.dry_run]
    pick = promoted[-1] if promoted else with_profile[0]
    assert pick.profile is not None
    return TrafficProfile.from_dict(pick.profile)


def _warm_configs(store: Store, history: list[DecisionRecord], k: int) -> list[tuple[str, Any]]:
    """The previous dated study's top ``k`` configs (by in-study objective)."""
    prev = next((d.study_name for d in reversed(history) if d.study_name), None)
    if prev is None or k == 0 or store.get_study(prev) is None:
        return []
    _, top = candidates_of(store.trials(prev, with_levels=False), k)
    return [(f"warm-{prev}-{t.optuna_trial_number}", dict(t.engine_args)) for t in top]


def _emit(path: str, rec: DecisionRecord, result: NightlyResult) -> NightlyResult:
    """Write the output file of a recorded decision. A file that cannot be written (a full
    disk, a read-only mount) costs one warning, never the decision or the exit status
    (docs/nightly.md#6-the-decision-and-the-output-file): the file it would have replaced is
    left whole (it is replaced atomically) and a run on the same day writes it again."""
    try:
        write_output(path, rec)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        line = f"the decision is recorded, but the output file was not written: {first}"
        log.warning("%s", line)
        log.debug("writing the output file failed", exc_info=True)
        result.warnings.append(line)
        result.output_written = False
    return result


def _finish(
    cfg: NightlyConfig, store: Store, rec: DecisionRecord, result: NightlyResult
) -> NightlyResult:
    """Record the decision, then write the output file: the decision is what the next night
    builds on, so nothing rendered after it can cost it."""
    if not cfg.dry_run:
        rec.output_path = str(Path(cfg.output))  # where the deploy pipeline reads it
    add_decision(store, rec)
    return result if cfg.dry_run else _record(cfg, rec, _emit(cfg.output, rec, result))


def _record(cfg: NightlyConfig, rec: DecisionRecord, result: NightlyResult) -> NightlyResult:
    """Commit the decision and the config in use to the git record (``record.git``,
    docs/git-record.md#4-nightly-decisions): after the decision is recorded, and costing at
    most one warning line. A dry run writes no output file and commits nothing."""
    if cfg.record.git is not None and not (cfg.dry_run or rec.dry_run):
        record_commit(cfg.record.git, decision_commit(rec))
    return result


def run_nightly(
    cfg: NightlyConfig,
    store: Store,
    *,
    skip_if_no_drift: bool = False,
    now: Callable[[], datetime] | None = None,
    on_event: OnEvent | None = None,
) -> NightlyResult:
    """The job, under the deployment's lock (a second run raises BusyError at once)."""
    with held_lock(store, f"nightly:{cfg.deployment}", _lock_busy(cfg.deployment)):
        return _run(cfg, store, skip_if_no_drift, (now or (lambda: datetime.now(UTC)))(), on_event)


def _run(
    cfg: NightlyConfig,
    store: Store,
    skip_if_no_drift: bool,
    now: datetime,
    on_event: OnEvent | None,
) -> NightlyResult:
    model = model_of(cfg)
    history = decisions(store, cfg.deployment)
    name = f"{cfg.deployment}-{now:%Y%m%d}"
    done = next((d for d in history if d.study_name == name and d.decision != "rollback"), None)
    if done is not None:  # idempotent: today's decision stands; emit it again
        again = NightlyResult(done, None, resumed=True)
        if cfg.dry_run or done.dry_run:
            return again
        return _record(cfg, done, _emit(cfg.output, done, again))
    ref: Refresh = refresh(cfg, vocab_size=model.vocab_size)
    for w in ref.warnings:
        log.warning("%s", w)
    scfg = study_config_for(cfg, name, ref.workload)
    bounds, defaults = today_bounds(scfg)
    incumbent = current_config(history) or {**defaults, **(cfg.incumbent or {})}
    cands = sorted({*bounds.max_model_len_candidates, int(incumbent["max_model_len"])})
    drift = detect_drift(_reference_profile(history), ref.profile, cands, cfg.drift)
    base = DecisionRecord(
        deployment=cfg.deployment,
        created_at=now,
        decision="keep",
        reason="",
        incumbent=dict(incumbent),
        deployed=dict(incumbent),
        exit_code=EXIT_KEEP,
        drift=drift.to_dict(),
        profile=ref.profile.to_dict(),
        model=cfg.model.name,
        dry_run=cfg.dry_run,
        command=serve_command(
            cfg.model.name, incumbent, cfg.worker.static_args, cfg.model.served_name
        ),
    )
    if skip_if_no_drift and history and not drift.drifted:
        base.reason = "no drift since the current config was chosen; the study was skipped"
        return _finish(cfg, store, base, NightlyResult(base, drift, True, warnings=ref.warnings))
    resumed = store.get_study(name) is not None
    if not resumed:
        warm = _warm_configs(store, history, cfg.budget.warm_top_k)
        # the smallest candidate that cuts at most half the over-length limit today
        limit = cfg.slo.max_overlength_rate / 2
        fit = [c for c in bounds.max_model_len_candidates if ref.profile.share_over(c) <= limit]
        fits = min(fit) if fit else max(bounds.max_model_len_candidates)
        _, projections = create_warm_study(scfg, store, incumbent, warm, fits)
        base.projection = [p.to_dict() for p in projections]
    rec = store.get_study(name)
    assert rec is not None
    run_study(name, store, timeout=cfg.budget.timeout_s, on_event=on_event, hooks=HOOKS)
    stored = load_study_config(rec)
    trials = store.trials(name)
    summary = summary_of(stored, store.repeats(name), trials, stored_noise(store, name))
    d = decide(summary, trials, cfg.min_gain_pct)
    base.study_name = name
    base.decision, base.reason, base.exit_code = d.kind, d.reason, d.exit_code
    if d.challenger is not None:
        base.challenger = dict(d.challenger.engine_args)
    if d.interval is not None:
        iv = d.interval
        base.gain_pct, base.gain_low, base.gain_high = iv.mean, iv.low, iv.high
        base.confidence = iv.confidence
    if d.kind == "promote" and base.challenger is not None:
        if not cfg.dry_run:  # the command is always the deployed config's
            base.deployed = dict(base.challenger)
            base.command = serve_command(
                cfg.model.name, base.challenger, cfg.worker.static_args, cfg.model.served_name
            )
        base.exit_code = EXIT_PROMOTED
    return _finish(
        cfg, store, base, NightlyResult(base, drift, resumed=resumed, warnings=ref.warnings)
    )


def rollback(
    store: Store,
    deployment: str,
    *,
    output: str | None = None,
    now: Callable[[], datetime] | None = None,
) -> DecisionRecord:
    """Re-emit the config in use before the last change, recorded as a ``rollback``
    decision, to ``output`` (default: the output file of the latest decision)."""
    with held_lock(store, f"nightly:{deployment}", _lock_busy(deployment)):
        history = decisions(store, deployment)
        if not history:
            raise NotFoundError(f"deployment {deployment!r} has no decisions to roll back")
        current = history[-1].deployed
        previous = None
        for i in range(len(history) - 1, 0, -1):
            if history[i].deployed != history[i - 1].deployed:
                previous = history[i - 1]
                break
        if previous is None:
            raise NotFoundError(
                f"deployment {deployment!r} has had one config only: nothing to roll back to"
            )
        path = output or next((d.output_path for d in reversed(history) if d.output_path), None)
        rec = DecisionRecord(
            deployment=deployment,
            created_at=(now or (lambda: datetime.now(UTC)))(),
            decision="rollback",
            reason=f"rolled back to the config in use before decision {history[i].id}",
            incumbent=dict(current),
            deployed=dict(previous.deployed),
            exit_code=EXIT_KEEP,
            study_name=previous.study_name,
            profile=previous.profile,
            model=previous.model,
            command=previous.command,
        )
        if path is not None:
            rec.output_path = str(write_output(path, rec))
        add_decision(store, rec)
        return rec
