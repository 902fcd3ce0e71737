"""The trial attributes autotune reads or writes (the codec's trial half; the study header is
``tuning/study_attrs.py``): the keys, typed records for what they hold
(:class:`TrialSummary`, :class:`BaselineEvidence`), their encoding, and the constraints every
trial reports (:func:`constraint_names`, in :func:`constraint_order`). No module but these two
names an attribute key; Optuna's private ids are read in ``store/optuna_ids.py`` alone. The
keys and JSON shapes are the stored format: older databases read unchanged
(docs/report.md#1-optuna-dashboard)."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import StudyConfig
from autotune.store.optuna_ids import trial_id
from autotune.tuning.measure.scoring import CONSTRAINT_NAMES

__all__ = [
    "CONSTRAINTS_KEY",
    "ENGINE_PREFIX",
    "BaselineEvidence",
    "TrialSummary",
    "as_enqueued",
    "baseline_evidence",
    "capacity_of",
    "compass_moved",
    "constraint_names",
    "constraint_order",
    "devices_of",
    "engine_attrs",
    "engine_value",
    "enqueue_attrs",
    "enqueued_engine_args",
    "failure_class_of",
    "fixed_params",
    "label_of",
    "requeued",
    "requeued_from",
    "retry_history",
    "set_metric_name",
    "stage_of",
    "twin_prediction",
    "write_compass",
    "write_devices",
    "write_failure_class",
    "write_recovered_summary",
    "write_stage",
    "write_trial_start",
    "write_trial_summary",
    "write_twin_prediction",
]

CONSTRAINTS_KEY = "constraints"  # Optuna's list format (trial), its legend (study)
STAGE_KEY = "stage"  # the trial user attributes: stage, label, devices, ...
LABEL_KEY = "label"
DEVICES_KEY = "devices"
FAILURE_CLASS_KEY = "failure_class"
CAPACITY_KEY = "capacity_scale"  # TrialSummary.capacity_scale's attribute
ENGINE_PREFIX = "engine."  # one per engine arg: engine.max_num_batched_tokens
_LEGACY_ENGINE_ARGS = "engine_args"  # studies before one attribute per arg
_FIXED_PARAMS = "fixed_params"  # trial system attributes: these two are Optuna's own
_RETRY_HISTORY = "retry_history"
REQUEUED_FROM_KEY = "autotune.requeued_from"  # a configuration re-queued because it never ran
# the twin strategy's predicted objective for a trial's config, beside what it measured
TWIN_PREDICTION_KEY = "autotune.twin_prediction"
# a staged joint-refinement trial the compass proposed, not TPE (its settle bar depends on it)
COMPASS_KEY = "autotune.compass"
_Trial = FrozenTrial | optuna.Trial


def write_compass(trial: optuna.Trial) -> None:
    """``trial`` is a compass move of the staged joint refinement
    (docs/tuning.md#14-settling-losing-trials)."""
    trial.set_user_attr(COMPASS_KEY, True)


def compass_moved(trial: FrozenTrial) -> bool:
    """Was ``trial`` a compass move (:func:`write_compass`)?"""
    return trial.user_attrs.get(COMPASS_KEY) is True


def write_twin_prediction(trial: _Trial, predicted: float) -> None:
    """What the twin predicted for this trial's config (docs/tuning.md#15-the-twin-strategy)."""
    trial.set_user_attr(TWIN_PREDICTION_KEY, float(predicted))


def twin_prediction(trial: FrozenTrial) -> float | None:
    """The twin's prediction for ``trial``; None: not a twin trial."""
    v = trial.user_attrs.get(TWIN_PREDICTION_KEY)
    return float(v) if isinstance(v, int | float) else None


def set_metric_name(study: optuna.Study, mode: str) -> None:
    """The objective's name: ``output tok/s at capacity`` in slo-capacity mode."""
    name = "output tok/s at capacity" if mode == "slo-capacity" else "output tok/s"
    with warnings.catch_warnings():
        # set_metric_names is experimental in Optuna 5; optuna-dashboard shows the name it
        # stores instead of "Objective 0", which is the point
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if study.metric_names != [name]:
            study.set_metric_names([name])


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
    return {LABEL_KEY: label, **engine_attrs(engine_args)}


def enqueued_engine_args(
    t: Mapping[str, Any] | _Trial,
) -> dict[str, Any] | None:
    """The engine args an enqueued trial (or its user attributes) was queued with (None for a
    sampled trial). Studies before one attribute per arg have one ``engine_args`` mapping."""
    user_attrs = t if isinstance(t, Mapping) else t.user_attrs
    if isinstance(user_attrs.get(_LEGACY_ENGINE_ARGS), Mapping):
        return dict(user_attrs[_LEGACY_ENGINE_ARGS])
    if LABEL_KEY not in user_attrs:
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


def engine_value(t: _Trial, name: str, default: Any = None) -> Any:
    """The engine value a trial ran (its engine attribute), else its sampled parameter."""
    return t.user_attrs.get(f"{ENGINE_PREFIX}{name}", t.params.get(name, default))


def _text(t: _Trial, key: str) -> str | None:  # a text attribute, None when not written
    v = t.user_attrs.get(key)
    return None if v is None else str(v)


def stage_of(t: _Trial) -> str | None:
    """The stage a trial was claimed for (None before its claim)."""
    return _text(t, STAGE_KEY)


def label_of(t: _Trial) -> str | None:
    """The enqueue label (``baseline``, ``enqueue-0``, a nightly projection), None if sampled."""
    return _text(t, LABEL_KEY)


def failure_class_of(t: _Trial) -> str | None:
    """The failure class a trial's worker ended with (None: it ran, or not yet written)."""
    return _text(t, FAILURE_CLASS_KEY)


def devices_of(t: FrozenTrial) -> str | None:
    return _text(t, DEVICES_KEY)


def retry_history(t: FrozenTrial) -> list[int]:
    """The trials this one retries, oldest first (Optuna's own system attribute)."""
    return [int(n) for n in t.system_attrs.get(_RETRY_HISTORY) or []]


def fixed_params(t: FrozenTrial) -> dict[str, Any]:
    """The parameters ``enqueue_trial`` fixed (Optuna's own system attribute)."""
    return dict(t.system_attrs.get(_FIXED_PARAMS) or {})


def as_enqueued(t: FrozenTrial) -> FrozenTrial:
    """``t`` with its parameters as ``enqueue_trial`` would give them (fixed parameters,
    no distributions): the baseline and ``enqueue:`` configs may lie outside the ranges on
    purpose, and a retry must run exactly the configuration that failed."""
    q = copy.deepcopy(t)
    q.params, q.distributions = {}, {}
    q.system_attrs = {**q.system_attrs, _FIXED_PARAMS: {**fixed_params(t), **t.params}}
    return q


def requeued_from(t: FrozenTrial) -> int | None:  # the trial it is a re-queued copy of
    v = t.system_attrs.get(REQUEUED_FROM_KEY)
    return None if v is None else int(v)


def requeued(t: FrozenTrial) -> FrozenTrial:
    """A WAITING copy of ``t`` as enqueued, marked as re-queued from it."""
    q = as_enqueued(t)
    marked = {**q.system_attrs, REQUEUED_FROM_KEY: t.number}
    return create_trial(state=TrialState.WAITING, user_attrs=q.user_attrs, system_attrs=marked)


def write_trial_start(
    study: optuna.Study,
    trial: optuna.Trial,
    stage: str,
    engine_args: Mapping[str, Any],
    mode: str,
) -> None:
    """What a RUNNING trial shows: the study's metric name, its stage and engine values."""
    set_metric_name(study, mode)
    trial.set_user_attr(STAGE_KEY, stage)
    for k, v in engine_attrs(engine_args).items():
        trial.set_user_attr(k, v)


def write_stage(trial: optuna.Trial, stage: str) -> None:  # at the claim, under its lock
    trial.set_user_attr(STAGE_KEY, stage)


def write_devices(trial: optuna.Trial, devices: str | None) -> None:
    """The lane's devices; written when the trial has some, or its retry's copy had."""
    if devices is not None or DEVICES_KEY in trial.user_attrs:
        trial.set_user_attr(DEVICES_KEY, devices)


def write_failure_class(trial: optuna.Trial, failure_class: str | None) -> None:
    trial.set_user_attr(FAILURE_CLASS_KEY, failure_class)


@dataclass(frozen=True)
class BaselineEvidence:
    """What the staged plan reads from the baseline (docs/tuning.md#8-the-staged-plan): its
    diagnosis, the SLO binding its capacity, and its capacity bracket's memory evidence."""

    diagnosis: str | None = None
    binding_slo: str | None = None
    kv_usage_peak: float | None = None
    preemptions: float | None = None
    levels: int = 0


@dataclass(frozen=True)
class TrialSummary:
    """A finished trial's user attributes (a None field is not written): its verdict, its
    headline figures for people in optuna-dashboard and :class:`BaselineEvidence`."""

    feasible: bool | None = None
    failure_class: str | None = None
    capacity_scale: float | None = None
    capacity_req_s: float | None = None
    capacity_status: str | None = None
    # how sure the capacity is (docs/tuning.md#1-the-capacity-lattice, "Noise"): runs that
    # held / runs at the capacity point and at the next point up ("2/3"), the band of load
    # scales where runs flipped, and whether every run agreed with one capacity
    capacity_held: str | None = None
    capacity_above_held: str | None = None
    capacity_band_low: float | None = None
    capacity_band_high: float | None = None
    capacity_monotone: bool | None = None
    # settled (docs/tuning.md#14-settling-losing-trials): the load scale it failed to hold,
    # and the trial whose capacity that was
    settled_below: float | None = None
    settled_against: int | None = None
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    kv_cache_tokens: int | None = None
    why_infeasible: str | None = None
    launch_command: str | None = None
    stopped: str | None = None
    diagnosis: str | None = None
    diagnosis_suggestion: str | None = None
    levels: int | None = None
    kv_usage_peak: float | None = None
    preemptions: float | None = None
    binding_slo: str | None = None

    def attrs(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


def _legend(names: Sequence[str]) -> str:
    return ", ".join(f"{i}: {n}" for i, n in enumerate(names)) + " (> 0 is violated)"


def constraint_names(cfg: StudyConfig) -> list[str]:
    """The constraints every trial of ``cfg`` reports to Optuna (the one place they are
    listed: the scored SLOs, and ``preemptions`` when ``telemetry.preemption_constraint``)."""
    return [*CONSTRAINT_NAMES, *(["preemptions"] if cfg.telemetry.preemption_constraint else [])]


def constraint_order(names: Sequence[str]) -> list[str]:
    """The order of a trial's constraint values, in Optuna and in ``TrialRecord``: by name."""
    return sorted(names)


def write_trial_summary(
    study: optuna.Study,
    trial: optuna.Trial,
    summary: TrialSummary,
    constraints: Mapping[str, float],
) -> list[str]:
    """Before ``study.tell``: the constraints (in :func:`constraint_order`), the summary and
    the study's legend of the constraints. optuna-dashboard 0.21 reads a trial's constraints
    only from the system attribute ``"constraints"`` (a list, what a sampler's
    ``constraints_func`` writes); Optuna 5's ``Trial.set_constraint`` writes keys it ignores,
    and writing both would give Optuna every constraint twice."""
    names = constraint_order(list(constraints))
    trial.storage.set_trial_system_attr(
        trial_id(trial), CONSTRAINTS_KEY, [float(constraints[n]) for n in names]
    )
    for k, v in summary.attrs().items():
        trial.set_user_attr(k, v)
    if study.user_attrs.get(CONSTRAINTS_KEY) != _legend(names):
        study.set_user_attr(CONSTRAINTS_KEY, _legend(names))
    return names


def write_recovered_summary(
    trial: optuna.Trial, feasible: bool | None, failure_class: str | None, scale: float | None
) -> None:
    """The verdict of a result autotune stored before its controller died (None written)."""
    trial.set_user_attr("feasible", feasible)
    trial.set_user_attr(FAILURE_CLASS_KEY, failure_class)
    trial.set_user_attr(CAPACITY_KEY, scale)


def capacity_of(t: FrozenTrial) -> float | None:
    """The capacity a finished trial recorded (the load scale of its highest held point)."""
    scale = t.user_attrs.get(CAPACITY_KEY)
    return None if scale is None else float(scale)


def baseline_evidence(t: FrozenTrial) -> BaselineEvidence:
    """The evidence a finished baseline trial recorded (its :class:`TrialSummary`)."""
    kv, pre = t.user_attrs.get("kv_usage_peak"), t.user_attrs.get("preemptions")
    return BaselineEvidence(
        diagnosis=_text(t, "diagnosis"),
        binding_slo=_text(t, "binding_slo"),
        kv_usage_peak=float(kv) if kv is not None else None,
        preemptions=float(pre) if pre is not None else None,
        levels=int(t.user_attrs.get("levels") or 0),
    )
