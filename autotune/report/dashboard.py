"""What autotune renders into Optuna for people who open a study in optuna-dashboard
(docs/report.md#1-optuna-dashboard): a Markdown note per trial and per study, and the report's
plots. The attributes the dashboard lists (the metric name, the constraints, one attribute per
engine arg and per headline figure) are written by the controller through
:mod:`autotune.tuning.attrs` (trials) and :mod:`autotune.tuning.study_attrs` (the study),
which own every attribute key; this module only renders.

The controller calls :data:`HOOKS` (given by the CLI and the nightly): :func:`note_trial`
before it tells Optuna a trial's result and :func:`refresh_after_run` when a run ends;
:func:`refresh` writes a whole study's notes and plots (``autotune dashboard``). Notes and
plots need the ``[report]`` extra (optuna-dashboard, plotly); without it they are skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import optuna

from autotune.config import StudyConfig
from autotune.errors import DatabaseLostError
from autotune.store import RepeatRecord, Store, StudyRecord, TrialRecord
from autotune.store.optuna_ids import trial_id

# the dashboard's name for the constraints' list, as tests and older callers import it
from autotune.tuning.attrs import constraint_names, constraint_order, set_metric_name
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.run.context import RunHooks
from autotune.tuning.study_attrs import read_noise

if TYPE_CHECKING:
    from autotune.tuning.measure.trial import TrialOutcome

__all__ = [
    "DASHBOARD_PLOT_HEIGHT",
    "HOOKS",
    "NOTE_AFTER_TRIAL_S",
    "PLOTS_AFTER_RUN_S",
    "note_trial",
    "refresh",
    "refresh_after_run",
]

log = logging.getLogger(__name__)

DASHBOARD_PLOT_HEIGHT = 450  # px: optuna-dashboard 0.21's box for a user plot
# Notes and plots for optuna-dashboard cost at most ~5 % of the time they describe: a note
# (~50 ms) is written when its trial took at least NOTE_AFTER_TRIAL_S, the study's note, the
# missing trial notes and the plots (~1 s) when the run took at least PLOTS_AFTER_RUN_S;
# `autotune dashboard` writes whatever is missing before it serves.
NOTE_AFTER_TRIAL_S = 1.0
PLOTS_AFTER_RUN_S = 20.0


def note_trial(trial: optuna.Trial, out: TrialOutcome, cfg: StudyConfig) -> None:
    """After the controller wrote the trial's attributes (:mod:`autotune.tuning.attrs`) and
    before it tells Optuna the result: the note of a trial that took at least
    :data:`NOTE_AFTER_TRIAL_S` (the study's note, the other trials' notes and the plots
    follow at the end of the run: :func:`refresh_after_run`)."""
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

    names = constraint_order(list(out.score.constraints))
    with _guarded(f"the note of trial {trial.number}"):
        dash.save_note(trial, trial_note(out.record, cfg.mode, names, lattice_of(cfg)))


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
    set_metric_name(study, cfg.mode)
    dash = _dashboard()
    if dash is None:
        return ["notes and plots (optuna-dashboard is not installed: the [report] extra)"]
    from autotune.report.notes import study_note, trial_note
    from autotune.report.study_view import study_view

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    names = constraint_order(constraint_names(cfg))
    for t in trials if trial_notes else ():
        frozen = by_number.get(t.optuna_trial_number)
        if t.state != "COMPLETE" or frozen is None:
            continue
        live = optuna.trial.Trial(study, trial_id(frozen))  # save_note needs a live Trial
        if not dash.get_note(live):
            dash.save_note(live, trial_note(t, cfg.mode, names, lattice_of(cfg)))
    view = study_view(record, cfg, list(trials), list(repeats), read_noise(study))
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


# what a run calls (the CLI and the nightly pass it; tuning never imports this module)
HOOKS = RunHooks(trial_told=note_trial, run_ended=refresh_after_run)
