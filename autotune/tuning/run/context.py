"""What a run of a study is handed and what it hands back: :class:`RunContext` (everything a
run needs, built once by :func:`autotune.tuning.run.controller.run_study` and passed down to the
lanes and the validation phase), :class:`RunHooks` (what the layers above add to a run) and
:class:`RunReport` (how the run went)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.config import StudyConfig
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.store import Store, StudyRecord
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.runner_protocol import Runner
from autotune.tuning.measure.trial import TrialOutcome
from autotune.tuning.run.events import OnEvent
from autotune.tuning.run.lanes import LanePlan
from autotune.tuning.run.session import ControllerSession
from autotune.tuning.search.space import SpaceBounds
from autotune.workload.core import Workload

__all__ = ["RunContext", "RunHooks", "RunReport"]


@dataclass(frozen=True)
class RunHooks:
    """What a run calls beyond tuning: the CLI and the nightly pass optuna-dashboard's
    notes and plots (``autotune.report.dashboard.HOOKS``, docs/report.md#7-after-the-run),
    which sit in a layer above this one. ``trial_told`` runs before Optuna is told a
    trial's result, ``run_ended`` after a run that ran trials (with its seconds).
    ``record``: the study's git record (``autotune.gitrecord``, docs/git-record.md), called
    after each trial's result is told (``final`` False) and when a run ends, its validation
    phase included (True); it never raises for git's failures."""

    trial_told: Callable[[optuna.Trial, TrialOutcome, StudyConfig], None]
    run_ended: Callable[[optuna.Study, StudyConfig, StudyRecord, Store, float], None]
    record: Callable[[StudyConfig, Store, bool], None] | None = None


@dataclass
class RunReport:
    trials_run: int
    stopped_by: str  # "plan complete" | "n_trials" | "timeout" | "gpu budget"
    idle_s: float = 0.0  # waiting for other controllers' trials (docs/faults.md)
    recovered: list[str] = field(default_factory=list)  # what the start-up recovery fixed
    retried: list[int] = field(default_factory=list)  # retries this run queued
    validation_runs: int = 0  # re-measurements made after the search (tuning/measure/validate.py)


@dataclass(frozen=True)
class RunContext:
    """One run of study ``cfg.name``: its config, stores, space, workload and profiles, the
    session that registers its workers, where its events go, its lanes (None: one lane, no
    ``--gpus``) and its limits (``timeout`` already defaulted from the config)."""

    cfg: StudyConfig
    store: Store
    study: optuna.Study
    bounds: SpaceBounds
    wl: Workload
    model: ModelProfile
    hw: HardwareProfile
    workdir: Path
    session: ControllerSession  # the worker registry of every runner of this run
    on_event: OnEvent | None
    plan: LanePlan | None
    hooks: RunHooks | None
    n_trials: int | None
    timeout: float | None

    def runner(
        self, gpus: str | None, cfg: StudyConfig | None = None, check_lengths: bool = True
    ) -> Runner:
        """A runner of the run's worker kind on ``gpus`` (for ``cfg``, default the run's);
        ``check_lengths`` as :func:`~autotune.tuning.measure.runner_factory.make_runner`."""
        return make_runner(
            cfg or self.cfg,
            self.model,
            self.hw,
            self.workdir,
            registry=self.session,
            gpus=gpus,
            check_lengths=check_lengths,
        )
