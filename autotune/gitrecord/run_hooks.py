"""What every run of a study calls beyond tuning (``RunHooks``, tuning/run/context.py):
optuna-dashboard's notes and plots (docs/report.md#7-after-the-run) and the git record
(docs/git-record.md). Each entry point that runs a study passes :data:`HOOKS`: `autotune
study run` and `study create --run` (the service runs these in a child process) and the
nightly job."""

from __future__ import annotations

import dataclasses

from autotune.gitrecord.study_record import record_run
from autotune.report import dashboard

__all__ = ["HOOKS"]

HOOKS = dataclasses.replace(dashboard.HOOKS, record=record_run)
