"""One trial: start the worker with the suggested engine args, replay the load levels the
mode asks for, score, and store everything (launch command, per-level results, failure
class). Worker failures are COMPLETE trials with objective 0 and positive violations."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import WorkerStartupError
from autotune.failures import FailureClass
from autotune.store import LevelRecord, Store, TrialRecord
from autotune.tuning.runners import LevelOutcome, Runner
from autotune.tuning.scoring import (
    CONSTRAINT_NAMES,
    LevelScore,
    Slo,
    TrialScore,
    failed_trial_score,
    next_scale,
    score_level,
    score_trial,
)
from autotune.workload.core import Workload

__all__ = ["Event", "TrialOutcome", "TrialSetup", "run_trial"]

log = logging.getLogger(__name__)

Event = Callable[[str, Mapping[str, Any]], None]


@dataclass
class TrialSetup:
    cfg: StudyConfig
    runner: Runner
    workload: Workload
    store: Store
    study_name: str
    on_event: Event | None = None
    # slo-capacity: the first load scale to try. The controller passes the best capacity
    # found so far, so the bracket's bisection resolves differences around the current best
    # instead of spending levels far away from it.
    start_scale: float = 1.0

    @property
    def slo(self) -> Slo:
        return Slo.of(self.cfg.slo)


@dataclass
class TrialOutcome:
    score: TrialScore
    record: TrialRecord
    failure_class: str | None


def _level_record(i: int, out: LevelOutcome, ls: LevelScore) -> LevelRecord:
    m = out.metrics
    total = int(m.get("completed", 0)) + int(m.get("failed", 0))
    return LevelRecord(
        level_index=i, scale=out.scale, offered_rate=out.offered_rate,
        achieved_rate=float(m.get("request_throughput") or 0.0),
        completed=int(m.get("completed", 0)), failed=int(m.get("failed", 0)),
        over_length=int(m.get("over_length_rejections", 0)),
        error_rate=(int(m.get("failed", 0)) / total) if total else 0.0,
        p99_ttft_ms=m.get("p99_ttft_ms"), p99_tpot_ms=m.get("p99_tpot_ms"),
        p99_itl_ms=m.get("p99_itl_ms"),
        output_throughput=float(m.get("output_throughput") or 0.0),
        request_throughput=float(m.get("request_throughput") or 0.0),
        goodput=m.get("request_goodput"), feasible=ls.feasible, metrics=dict(m),
        telemetry=out.extra.get("telemetry"), diagnosis=out.extra.get("diagnosis"))


def _scales(cfg: StudyConfig, history: list[tuple[float, bool]],
            start: float) -> float | None:
    if cfg.mode != "slo-capacity":
        return None if history else 1.0
    st = cfg.strategy
    return next_scale(history, low=st.capacity_low, high=st.capacity_high,
                      budget=st.capacity_levels, start=start)


async def run_trial(setup: TrialSetup, *, number: int, stage: str, params: Mapping[str, Any],
                    engine_args: Mapping[str, Any]) -> TrialOutcome:
    """Run one configuration end to end. Never raises for a worker failure; re-raises
    cancellation after stopping the worker and marking the stored trial FAIL."""
    cfg, runner, store = setup.cfg, setup.runner, setup.store
    emit = setup.on_event or (lambda _k, _d: None)
    rec = TrialRecord(
        study_name=setup.study_name, optuna_trial_number=number, stage=stage, state="RUNNING",
        params=dict(params), engine_args=dict(engine_args), launch_command=None,
        launch_argv=None, worker_kind=runner.kind, started_at=datetime.now(UTC))
    rec.id = store.add_trial(rec)
    emit("trial_start", {"number": number, "stage": stage, "engine_args": dict(engine_args)})
    failure: str | None = None
    levels: list[LevelScore] = []
    try:
        try:
            info = await runner.start(engine_args, f"trial-{number:04d}")
        except WorkerStartupError as exc:
            failure = str(exc.failure_class)
            tail = getattr(exc, "log_tail", None) or str(exc)
            store.update_trial(rec.id, failure_class=failure, log_tail=tail[-8000:])
            rec.failure_class, rec.log_tail = failure, tail[-8000:]
            emit("worker_failed", {"number": number, "failure_class": failure,
                                   "message": str(exc).splitlines()[0][:300]})
        else:
            rec.launch_command, rec.launch_argv = info.command, list(info.argv)
            rec.startup_s, rec.kv_cache_tokens = info.startup_s, info.kv_cache_tokens
            rec.max_concurrency = info.max_concurrency
            store.update_trial(rec.id, launch_command=info.command, launch_argv=list(info.argv),
                               startup_s=info.startup_s, kv_cache_tokens=info.kv_cache_tokens,
                               max_concurrency=info.max_concurrency)
            history: list[tuple[float, bool]] = []
            while (scale := _scales(cfg, history, setup.start_scale)) is not None:
                emit("level_start", {"number": number, "scale": scale})
                def live(p: Any, n: int = number, sc: float = scale) -> None:
                    emit("level_progress", {"number": n, "scale": sc, "sent": p.sent,
                                            "planned": p.planned, "completed": p.completed,
                                            "failed": p.failed, "p99_ttft_ms": p.p99_ttft_ms})

                out = await runner.run_level(setup.workload, scale, progress=live)
                ls = score_level(out.metrics, setup.slo, scale,
                                 latency_slos=cfg.mode != "offline",
                                 preemption_constraint=cfg.telemetry.preemption_constraint)
                dead = runner.failure()
                if dead is not None:  # the worker died under load (OOM, engine crash)
                    failure = str(dead.failure_class)
                    store.update_trial(rec.id, failure_class=failure, log_tail=dead.line)
                    break
                lvl = _level_record(len(history), out, ls)
                lvl.id = store.add_level(rec.id, lvl)
                rec.levels.append(lvl)
                levels.append(ls)
                history.append((scale, ls.feasible))
                emit("level_done", {"number": number, "scale": scale, "feasible": ls.feasible,
                                    "metrics": out.metrics})
                others = [v for k, v in ls.violations.items() if k != "overlength_rate"]
                if ls.violations["overlength_rate"] > 0 and all(v <= 0 for v in others):
                    break  # requests longer than max_model_len: no other load level helps
    except BaseException:
        store.update_trial(rec.id, state="FAIL", finished_at=datetime.now(UTC))
        raise
    finally:
        await runner.stop()
    names = [*CONSTRAINT_NAMES, *(["preemptions"] if cfg.telemetry.preemption_constraint
                                   else [])]
    score = failed_trial_score(names) if failure is not None else score_trial(levels)
    if failure is None and not levels:
        failure = str(FailureClass.UNKNOWN)
    rec.state, rec.objective = "COMPLETE", score.objective
    rec.constraints = [score.constraints[k] for k in sorted(score.constraints)]
    rec.feasible, rec.capacity_scale = score.feasible, score.capacity_scale
    rec.failure_class = failure
    rec.finished_at = datetime.now(UTC)
    # the bottleneck that stops this config from taking more load
    top = rec.headline_level()
    if top is not None:
        rec.diagnosis = top.diagnosis
    store.update_trial(rec.id, state="COMPLETE", objective=score.objective,
                       constraints=rec.constraints, feasible=score.feasible,
                       capacity_scale=score.capacity_scale, failure_class=failure,
                       diagnosis=rec.diagnosis, finished_at=rec.finished_at)
    emit("trial_done", {"number": number, "stage": stage, "objective": score.objective,
                        "feasible": score.feasible, "failure_class": failure,
                        "capacity_scale": score.capacity_scale,
                        "constraints": score.constraints})
    return TrialOutcome(score, rec, failure)
