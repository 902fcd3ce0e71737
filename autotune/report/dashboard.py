"""Everything autotune writes into Optuna for people who open a study in optuna-dashboard
(docs/report.md#1-optuna-dashboard): the metric name, the constraints in the format the
dashboard reads, one attribute per engine arg and per headline figure, a Markdown note per trial and
per study, and the report's plots.

The controller calls :func:`record_trial_start` when a trial starts, :func:`record_trial`
before it tells Optuna the result and :func:`refresh_after_run` when a run ends;
:func:`refresh` writes a whole study's notes and plots (``autotune dashboard``). Notes and
plots need the ``[report]`` extra (optuna-dashboard, plotly); without it they are skipped
and everything else is written.

Constraints: optuna-dashboard 0.21 reads a trial's constraints only from the system
attribute ``"constraints"`` (a list, what a sampler's ``constraints_func`` writes); Optuna
5's ``Trial.set_constraint`` writes ``"constraints:<name>"`` keys the dashboard ignores, and
writing both would give Optuna every constraint twice. autotune writes the list alone, in
:func:`constraint_order` (the order of ``TrialRecord.constraints``), so samplers see exactly
the four constraints (keys ``"0"`` .. ``"3"``) and the study's ``constraints`` user attribute
names them.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import optuna

from autotune.config import StudyConfig
from autotune.errors import DatabaseLostError
from autotune.report.levels import record_stopped
from autotune.report.recommend import capacity_rps, why_infeasible
from autotune.store import RepeatRecord, Store, StudyRecord, TrialRecord
from autotune.tuning.scoring import CONSTRAINT_NAMES, Slo, binding_slo
from autotune.tuning.stages import capacity_bracket, memory_evidence

if TYPE_CHECKING:
    from autotune.tuning.trial import TrialOutcome

__all__ = [
    "CONSTRAINTS_KEY",
    "DASHBOARD_PLOT_HEIGHT",
    "ENGINE_PREFIX",
    "NOTE_AFTER_TRIAL_S",
    "PLOTS_AFTER_RUN_S",
    "constraint_names",
    "constraint_order",
    "engine_attrs",
    "enqueue_attrs",
    "enqueued_engine_args",
    "metric_name",
    "record_trial",
    "record_trial_start",
    "refresh",
    "refresh_after_run",
]

log = logging.getLogger(__name__)

CONSTRAINTS_KEY = "constraints"  # Optuna's list format, the one optuna-dashboard reads
DASHBOARD_PLOT_HEIGHT = 450  # px: optuna-dashboard 0.21's box for a user plot
# Notes and plots for optuna-dashboard cost at most ~5 % of the time they describe: a note
# (~50 ms) is written when its trial took at least NOTE_AFTER_TRIAL_S, the study's note, the
# missing trial notes and the plots (~1 s) when the run took at least PLOTS_AFTER_RUN_S;
# `autotune dashboard` writes whatever is missing before it serves.
NOTE_AFTER_TRIAL_S = 1.0
PLOTS_AFTER_RUN_S = 20.0
ENGINE_PREFIX = "engine."  # user attribute per engine arg: engine.max_num_batched_tokens


def metric_name(mode: str) -> str:
    return "output tok/s at capacity" if mode == "slo-capacity" else "output tok/s"


def constraint_names(cfg: StudyConfig) -> list[str]:
    """The constraints every trial of a study reports (tuning.trial scores them)."""
    return [*CONSTRAINT_NAMES, *(["preemptions"] if cfg.telemetry.preemption_constraint else [])]


def constraint_order(names: Sequence[str]) -> list[str]:
    """The order of a trial's constraint values, in Optuna and in ``TrialRecord``: by name."""
    return sorted(names)


def _tidy(v: Any) -> Any:
    # 0.8500000000000001 (Optuna's stepped floats) -> 0.85; no real engine value needs 10 digits
    return round(v, 10) if isinstance(v, float) and math.isfinite(v) else v


def engine_attrs(engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """One attribute per engine arg, numbers kept numbers (the dashboard sorts them), None
    left out; a mapping (a JSON flag) becomes one attribute per key, a list one string."""
    out: dict[str, Any] = {}
    for k, v in engine_args.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            out.update({f"{ENGINE_PREFIX}{k}.{sk}": _tidy(sv) for sk, sv in v.items()})
        elif isinstance(v, list | tuple):
            out[f"{ENGINE_PREFIX}{k}"] = " ".join(map(str, v))
        else:
            out[f"{ENGINE_PREFIX}{k}"] = _tidy(v)
    return out


def enqueue_attrs(label: str, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The user attributes of an enqueued trial (the baseline, ``enqueue:`` configs)."""
    return {"label": label, **engine_attrs(engine_args)}


def enqueued_engine_args(user_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine args an enqueued trial was queued with (None for a sampled trial).
    Studies created before one attribute per arg keep them as one ``engine_args`` mapping."""
    if isinstance(user_attrs.get("engine_args"), Mapping):
        return dict(user_attrs["engine_args"])
    if "label" not in user_attrs:
        return None
    out: dict[str, Any] = {}
    for key, v in user_attrs.items():
        if key.startswith(ENGINE_PREFIX):
            name, _, sub = key[len(ENGINE_PREFIX) :].partition(".")
            if sub:
                out.setdefault(name, {})[sub] = v
            else:
                out[name] = v
    return out or None


def _set_metric_name(study: optuna.Study, mode: str) -> None:
    with warnings.catch_warnings():
        # set_metric_names is experimental in Optuna 5; optuna-dashboard shows the name it
        # stores instead of "Objective 0", which is the point
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if study.metric_names != [metric_name(mode)]:
            study.set_metric_names([metric_name(mode)])


def record_trial_start(
    study: optuna.Study, trial: optuna.Trial, stage: str, engine_args: Mapping[str, Any], mode: str
) -> None:
    """What a RUNNING trial shows: its stage and engine values."""
    _set_metric_name(study, mode)
    trial.set_user_attr("stage", stage)
    for k, v in engine_attrs(engine_args).items():
        trial.set_user_attr(k, v)


def _outcome_attrs(out: TrialOutcome, cfg: StudyConfig) -> dict[str, Any]:
    rec, score = out.record, out.score
    top = rec.headline_level()
    rps = capacity_rps(rec)
    attrs: dict[str, Any] = {
        "feasible": score.feasible,
        "failure_class": out.failure_class,
        "capacity_scale": round(score.capacity_scale, 4) if score.capacity_scale else None,
        "capacity_req_s": round(rps, 3) if rps is not None else None,
        "capacity_status": score.capacity.status if score.capacity is not None else None,
        "p99_ttft_ms": round(top.p99_ttft_ms, 1) if top and top.p99_ttft_ms is not None else None,
        "p99_tpot_ms": round(top.p99_tpot_ms, 2) if top and top.p99_tpot_ms is not None else None,
        "kv_cache_tokens": rec.kv_cache_tokens,
        "why_infeasible": why_infeasible(rec, cfg.mode),
        "launch_command": rec.launch_command,
    }
    if (s := record_stopped(top)) is not None:  # a stopped level: only what it measured
        p99s = {k: s.values[k] for k in ("p99_ttft_ms", "p99_tpot_ms")}
        attrs |= {k: None if v is None else round(v, 2) for k, v in p99s.items()}
        attrs["stopped"] = s.stop.text
    if rec.diagnosis:
        attrs["diagnosis"] = rec.diagnosis.get("kind")
        attrs["diagnosis_suggestion"] = rec.diagnosis.get("suggestion")
    # what the staged plan reads from the baseline (docs/tuning.md#8-the-staged-plan)
    mem = memory_evidence(lv.diagnosis for lv in capacity_bracket(rec.levels))
    attrs["levels"] = mem.levels
    attrs["kv_usage_peak"] = round(mem.kv_peak, 4) if mem.kv_peak is not None else None
    attrs["preemptions"] = mem.preemptions
    if score.feasible and top is not None:  # which latency SLO binds at the capacity
        attrs["binding_slo"] = binding_slo(top.p99_ttft_ms, top.p99_tpot_ms, Slo.of(cfg.slo))
    return {k: v for k, v in attrs.items() if v is not None}


def record_trial(
    study: optuna.Study, trial: optuna.Trial, out: TrialOutcome, cfg: StudyConfig
) -> None:
    """Before ``study.tell``: the constraints, the outcome's attributes and, for a trial
    that took at least :data:`NOTE_AFTER_TRIAL_S`, its note (the study's note, the other
    trials' notes and the plots follow at the end of the run: :func:`refresh_after_run`)."""
    names = constraint_order(list(out.score.constraints))
    # Optuna's own key for the list format (samplers' constraints_func write it likewise)
    trial.storage.set_trial_system_attr(
        trial._trial_id, CONSTRAINTS_KEY, [float(out.score.constraints[n]) for n in names]
    )
    for k, v in _outcome_attrs(out, cfg).items():
        trial.set_user_attr(k, v)
    if study.user_attrs.get(CONSTRAINTS_KEY) != _legend(names):
        study.set_user_attr(CONSTRAINTS_KEY, _legend(names))
    rec = out.record
    took = (
        (rec.finished_at - rec.started_at).total_seconds()
        if rec.finished_at is not None and rec.started_at is not None
        else 0.0
    )
    dash = _dashboard() if took >= NOTE_AFTER_TRIAL_S else None
    if dash is None:
        return
    from autotune.report.notes import trial_note

    with _guarded(f"the note of trial {trial.number}"):
        dash.save_note(trial, trial_note(out.record, cfg.mode, names))


@contextmanager
def _guarded(what: str) -> Iterator[None]:
    """What is only shown in optuna-dashboard never costs a trial or a run: a failure is one
    warning line, its traceback is logged at debug level (docs/report.md#7-after-the-run).
    A lost database is the exception: the run's next call reports it, once."""
    try:
        yield
    except DatabaseLostError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        log.warning(
            "optuna-dashboard: %s not written (%s: %s); `autotune dashboard` writes what "
            "is missing",
            what,
            type(exc).__name__,
            first,
        )
        log.debug("optuna-dashboard: %s not written", what, exc_info=True)


def _legend(names: Sequence[str]) -> str:
    return ", ".join(f"{i}: {n}" for i, n in enumerate(names)) + " (> 0 is violated)"


def _dashboard() -> Any:
    try:
        import optuna_dashboard
    except ImportError:
        return None
    return optuna_dashboard


def refresh(
    study: optuna.Study,
    cfg: StudyConfig,
    record: StudyRecord,
    trials: Sequence[TrialRecord],
    repeats: Sequence[RepeatRecord] = (),
    *,
    trial_notes: bool = True,
    plots: bool = True,
) -> list[str]:
    """Write the study's note, (with ``trial_notes``) a note for every complete trial that
    has none, and (with ``plots``) the report's figures as dashboard plots. Returns what it
    could not write (the ``[report]`` extra missing), empty when all was written."""
    _set_metric_name(study, cfg.mode)
    dash = _dashboard()
    if dash is None:
        return ["notes and plots (optuna-dashboard is not installed: the [report] extra)"]
    from autotune.report.notes import study_note, trial_note
    from autotune.report.summary import study_view

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    names = constraint_order(constraint_names(cfg))
    for t in trials if trial_notes else ():
        frozen = by_number.get(t.optuna_trial_number)
        if t.state != "COMPLETE" or frozen is None:
            continue
        live = optuna.trial.Trial(study, frozen._trial_id)  # save_note needs a live Trial
        if not dash.get_note(live):
            dash.save_note(live, trial_note(t, cfg.mode, names))
    view = study_view(record, cfg, list(trials), list(repeats))
    dash.save_note(study, study_note(view))
    if not plots:
        return []
    try:
        from autotune.report.plots import figures
    except ImportError:
        return ["plots (plotly is not installed: the [report] extra)"]
    for fid, fig in figures(view).items():
        # the dashboard draws each plot in a box 450 px high
        fig.update_layout(height=DASHBOARD_PLOT_HEIGHT)
        dash.save_plotly_graph_object(study, fig, graph_object_id=fid)
    return []


def refresh_after_run(
    study: optuna.Study, cfg: StudyConfig, record: StudyRecord, store: Store, run_s: float
) -> None:
    """After a run of at least :data:`PLOTS_AFTER_RUN_S`: the study's note, the notes of
    trials that have none (those shorter than :data:`NOTE_AFTER_TRIAL_S`) and the plots."""
    if run_s < PLOTS_AFTER_RUN_S:
        return
    missing: list[str] = []
    with _guarded("the study's note and plots"):
        missing = refresh(study, cfg, record, store.trials(record.name), store.repeats(record.name))
    for what in missing:
        log.info("optuna-dashboard: no %s", what)
