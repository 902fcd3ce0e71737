"""The storage ids of Optuna's studies and trials, which Optuna keeps private (``_study_id``,
``_trial_id``) and has no public accessor for. The storage wrapper, the attribute codec and
the dashboard's links need them; this module is the one place that reads Optuna's private
attributes, so an Optuna upgrade that renames them is mended here alone."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

__all__ = ["study_id", "trial_id"]


def trial_id(t: optuna.Trial | FrozenTrial) -> int:
    """The storage's id of a trial."""
    return int(t._trial_id)


def study_id(study: optuna.Study) -> int:
    """The storage's id of a study (optuna-dashboard's URLs use it)."""
    return int(study._study_id)
