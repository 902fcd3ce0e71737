"""The study attributes autotune reads or writes (the codec's study half; trial attributes
are ``tuning/attrs.py``): the keys, the :class:`StudyHeader` a study is created with, its
widenings and its validation summary. The keys and JSON shapes are the stored format: older
databases read unchanged (docs/report.md#1-optuna-dashboard)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage

from autotune.errors import StorageError
from autotune.store import Store
from autotune.tuning.attrs import enqueue_attrs, twin_prediction
from autotune.tuning.measure.noise import NoiseRecord
from autotune.tuning.search.space import SpaceBounds, enqueue_params

__all__ = [
    "NOISE_KEY",
    "SCREENING_KEY",
    "VALIDATION_KEY",
    "WIDENED_KEY",
    "StudyHeader",
    "bounds_from_json",
    "open_study",
    "read_header",
    "read_noise",
    "read_twin",
    "read_widenings",
    "stored_noise",
    "stored_twin",
    "write_noise",
    "write_twin",
    "write_validation",
    "write_widenings",
]

BOUNDS_KEY = "autotune.bounds"  # study user attributes; SpaceBounds as a JSON string
BASELINE_KEY = "autotune.baseline"  # the baseline's engine args
FINGERPRINT_KEY = "autotune.workload_fingerprint"
SCREENING_KEY = "autotune.max_model_len_screening"  # Screening.to_dict()
PROJECTION_KEY = "autotune.nightly_projection"  # the nightly's Projection dicts
WIDENED_KEY = "autotune.widened"  # a list of Widening dicts (tuning/search/edges.py)
VALIDATION_KEY = "autotune.validation"  # the validation summary (tuning/measure/validate.py)
NOISE_KEY = "autotune.noise"  # the server's noise: NoiseRecord.to_dict() (tuning/measure/noise.py)
# the twin strategy's latest round: TwinRound.to_dict() (tuning/measure/twin_round.py)
TWIN_KEY = "autotune.twin"


def bounds_from_json(text: str) -> SpaceBounds:
    d = json.loads(text)
    d["max_model_len_candidates"] = tuple(d["max_model_len_candidates"])
    d["extras"] = tuple((n, tuple(c)) for n, c in d["extras"])
    d["parallel"] = tuple(d.get("parallel", ()))  # studies from before the parallelism stage
    return SpaceBounds(**d)


@dataclass(frozen=True)
class StudyHeader:
    """What a study is created with: its search space, its baseline and its workload; a study
    created by ``study create`` has the screening, a nightly one its projections."""

    bounds: SpaceBounds
    baseline: Mapping[str, Any]
    workload_fingerprint: str | None
    screening: dict[str, Any] | None = None
    nightly_projection: list[dict[str, Any]] | None = None

    def attrs(self) -> dict[str, Any]:
        out = {
            BOUNDS_KEY: json.dumps(asdict(self.bounds)),
            BASELINE_KEY: dict(self.baseline),
            FINGERPRINT_KEY: self.workload_fingerprint,
            SCREENING_KEY: self.screening,
            PROJECTION_KEY: self.nightly_projection,
        }
        return {k: v for k, v in out.items() if v is not None}


def read_header(study: optuna.Study) -> StudyHeader:
    """What a study was created with (its bounds before any widening)."""
    u = study.user_attrs
    fingerprint = u.get(FINGERPRINT_KEY)
    return StudyHeader(
        bounds_from_json(str(u[BOUNDS_KEY])),
        dict(u.get(BASELINE_KEY) or {}),
        None if fingerprint is None else str(fingerprint),
        u.get(SCREENING_KEY),
        u.get(PROJECTION_KEY),
    )


def read_widenings(study: Any) -> list[dict[str, Any]]:
    """The stored widenings (of a study, or its user attributes), oldest first."""
    return list((study if isinstance(study, Mapping) else study.user_attrs).get(WIDENED_KEY, []))


def write_widenings(study: Any, widenings: Sequence[Mapping[str, Any]]) -> None:
    study.set_user_attr(WIDENED_KEY, [dict(w) for w in widenings])


def write_validation(study: optuna.Study, summary: Any) -> None:
    study.set_user_attr(VALIDATION_KEY, summary)


def write_noise(study: optuna.Study, record: NoiseRecord) -> None:
    """Store the server's noise, measured once per study (docs/tuning.md#7-validation)."""
    study.set_user_attr(NOISE_KEY, record.to_dict())


def read_noise(study: Any) -> NoiseRecord | None:
    """The stored noise record (of a study, or its user attributes); None: not measured
    (a study from before it was, or the baseline's worker died while measuring it)."""
    d = (study if isinstance(study, Mapping) else study.user_attrs).get(NOISE_KEY)
    return NoiseRecord.from_dict(d) if isinstance(d, Mapping) else None


def write_twin(study: optuna.Study, round_: Mapping[str, Any]) -> None:
    """Store the twin strategy's latest round (docs/tuning.md#15-the-twin-strategy)."""
    study.set_user_attr(TWIN_KEY, dict(round_))


def read_twin(study: Any) -> dict[str, Any] | None:
    """The twin strategy's latest round as stored (of a study, or its user attributes);
    None: no round ran yet."""
    d = (study if isinstance(study, Mapping) else study.user_attrs).get(TWIN_KEY)
    return dict(d) if isinstance(d, Mapping) else None


def stored_noise(store: Store, name: str) -> NoiseRecord | None:
    """The noise record of autotune study ``name`` as stored with its Optuna study (None:
    no such study, or no record), for the readers that recompute its validation summary."""
    rec = store.get_study(name)
    if rec is None:
        return None
    storage = store.optuna_storage()
    try:
        sid = storage.get_study_id_from_name(rec.optuna_study_name)
    except KeyError:
        return None
    return read_noise(storage.get_study_user_attrs(sid))


def stored_twin(store: Store, name: str) -> tuple[dict[str, Any] | None, dict[int, float]]:
    """The twin strategy's latest round of study ``name`` and what the twin predicted for
    each twin trial before it ran (trial number -> objective), as stored with its Optuna
    study; (None, {}) for a study of another strategy."""
    rec = store.get_study(name)
    if rec is None:
        return None, {}
    storage = store.optuna_storage()
    try:
        sid = storage.get_study_id_from_name(rec.optuna_study_name)
    except KeyError:
        return None, {}
    preds = {
        t.number: p
        for t in storage.get_all_trials(sid, deepcopy=False)
        if (p := twin_prediction(t)) is not None
    }
    return read_twin(storage.get_study_user_attrs(sid)), preds


def open_study(
    storage: BaseStorage,
    name: str,
    header: StudyHeader,
    configs: Sequence[tuple[str, Mapping[str, Any]]],
) -> optuna.Study:
    """Create the Optuna study ``name``, write its header and enqueue ``configs`` (label,
    engine args: the baseline first). An Optuna study of that name that already has trials
    (left by another tool, or autotune's rows deleted) is refused, never mixed in."""
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True
    )
    if study.trials:
        raise StorageError(
            f"an Optuna study named {name!r} already has trials in this "
            "database; pick another study name"
        )
    for key, value in header.attrs().items():
        study.set_user_attr(key, value)
    for label, engine_args in configs:
        study.enqueue_trial(
            enqueue_params(header.bounds, engine_args),
            user_attrs=enqueue_attrs(label, engine_args),
        )
    return study
