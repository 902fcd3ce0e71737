"""Stepped float parameters stored as the decimals they stand for.

Optuna maps a stepped float back from its search space as ``low + k * step``, so
``gpu_memory_utilization`` in [0.80, 0.95] with step 0.01 is stored, shown in
optuna-dashboard and fixed into later stages as 0.8500000000000001. :class:`TidySteps` wraps
any sampler and rounds such values to 10 decimals, far below any step a study uses, so the
stored parameter is the value passed to vLLM (docs/report.md#1-optuna-dashboard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

__all__ = ["TidySteps", "tidy_steps"]

_DIGITS = 10


def _tidy(value: Any, dist: BaseDistribution) -> Any:
    if isinstance(dist, FloatDistribution) and dist.step is not None and isinstance(value, float):
        return round(value, _DIGITS)
    return value


class TidySteps(BaseSampler):
    """``inner`` with its stepped float suggestions rounded (everything else delegated)."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner

    def __str__(self) -> str:
        return f"TidySteps({self.inner})"

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        values = self.inner.sample_relative(study, trial, search_space)
        return {k: _tidy(v, search_space[k]) if k in search_space else v for k, v in values.items()}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        value = self.inner.sample_independent(study, trial, param_name, param_distribution)
        return _tidy(value, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def tidy_steps(sampler: optuna.samplers.BaseSampler) -> TidySteps:
    return sampler if isinstance(sampler, TidySteps) else TidySteps(sampler)
