"""Optuna's RDB storage, made to ride out database outages (docs/faults.md#4-database-outages).

:class:`ResilientStorage` wraps one :class:`optuna.storages.RDBStorage` (one engine, one
bounded pool per process) and sends every call through a :class:`Resilience`: reads and
idempotent writes (attributes are upserts) are simply retried; before a non-idempotent write
(creating a trial, changing its state, setting a parameter) is retried, the storage is asked
whether the first attempt landed. Every caller (``ask``, ``tell``, samplers, heartbeats) goes
through it unchanged, because it is a complete :class:`~optuna.storages.BaseStorage`.

It is also where a run's heartbeat settings live: Optuna reads them from the storage
(``fail_stale_trials``), and the storage is built before the study's config is known.

Like Optuna's own cache for RDB storages (which wraps only an ``RDBStorage`` itself), it
keeps finished trials, which Optuna never changes again, and reads only the unfinished and
the new ones from the database: a sampler reads the study's trials many times per ``ask``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.study._frozen import FrozenStudy
from optuna.study._study_direction import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.store.optuna_ids import trial_id
from autotune.store.resilience import NOT_LANDED, NotLanded, Resilience

__all__ = ["ResilientStorage", "StaleCallback"]

T = TypeVar("T")

StaleCallback = Callable[["optuna.Study", FrozenTrial], None]


def _identity(t: FrozenTrial) -> tuple[str, str, str, str]:
    return (str(t.state), repr(sorted(t.params.items())), repr(t.user_attrs), repr(t.system_attrs))


@dataclass
class _Cached:
    """One study's trials as last read: finished ones by id, the ids still unfinished."""

    finished: dict[int, FrozenTrial] = field(default_factory=dict)
    unfinished: set[int] = field(default_factory=set)
    last_finished: int = -1  # the highest finished trial id: newer ids are read again
    distributions: dict[str, BaseDistribution] = field(default_factory=dict)


class ResilientStorage(BaseStorage, BaseHeartbeat):
    """``inner`` behind ``resilience``; see the module docstring."""

    def __init__(self, inner: RDBStorage, resilience: Resilience) -> None:
        self.inner = inner
        self.resilience = resilience
        self._cache: dict[int, _Cached] = {}
        self._study_of: dict[int, int] = {}  # trial id -> study id
        self._lock = threading.Lock()
        self.heartbeat_interval: int | None = None
        self.grace_period: int | None = None
        self.stale_callback: StaleCallback | None = None

    # -- heartbeat settings ------------------------------------------------------------------

    def configure_heartbeat(
        self, interval_s: int | None, grace_s: int | None, callback: StaleCallback | None
    ) -> None:
        """Turn heartbeats on for this process's runs. Optuna's RDBStorage takes these as
        constructor arguments and reads them back from the same-named attributes when it
        looks for stale trials; the storage here is shared by the whole process and built
        before any study config is read, so they are set on it afterwards (and cleared, all
        ``None``, when the run ends)."""
        self.heartbeat_interval, self.grace_period = interval_s, grace_s
        self.stale_callback = callback
        self.inner.heartbeat_interval, self.inner.grace_period = interval_s, grace_s

    def record_heartbeat(self, trial_id: int) -> None:
        self._call(
            f"recording trial id {trial_id}'s heartbeat",
            lambda: self.inner.record_heartbeat(trial_id),
        )

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self._call(
            "looking for stale trials", lambda: self.inner._get_stale_trial_ids(study_id)
        )

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> StaleCallback | None:
        return self.stale_callback

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return self.resilience.call(what, fn)

    def close(self) -> None:
        self.inner.remove_session()
        self.inner.engine.dispose()

    def remove_session(self) -> None:
        self.inner.remove_session()

    # -- studies -----------------------------------------------------------------------------

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        def landed() -> int | NotLanded:
            if study_name is None:
                return NOT_LANDED
            try:
                return self.inner.get_study_id_from_name(study_name)
            except KeyError:
                return NOT_LANDED

        study_id = self.resilience.call(
            f"creating Optuna study {study_name!r}",
            lambda: self.inner.create_new_study(directions, study_name),
            landed=landed,
        )
        with self._lock:
            self._cache.pop(study_id, None)
        return study_id

    def delete_study(self, study_id: int) -> None:
        def landed() -> NotLanded | None:
            try:
                self.inner.get_study_name_from_id(study_id)
            except KeyError:
                return None
            return NOT_LANDED

        self.resilience.call(
            f"deleting Optuna study id {study_id}",
            lambda: self.inner.delete_study(study_id),
            landed=landed,
        )
        with self._lock:
            self._cache.pop(study_id, None)  # SQLite may hand its id to the next study

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "setting a study attribute",
            lambda: self.inner.set_study_user_attr(study_id, key, value),
        )

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "setting a study attribute",
            lambda: self.inner.set_study_system_attr(study_id, key, value),
        )

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._call("reading a study", lambda: self.inner.get_study_id_from_name(study_name))

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._call("reading a study", lambda: self.inner.get_study_name_from_id(study_id))

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._call("reading a study", lambda: self.inner.get_study_directions(study_id))

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call("reading a study", lambda: self.inner.get_study_user_attrs(study_id))

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call("reading a study", lambda: self.inner.get_study_system_attrs(study_id))

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._call("listing studies", lambda: self.inner.get_all_studies())

    # -- trials ------------------------------------------------------------------------------

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        """Not idempotent: a retry first looks for the trial the failed attempt may have
        made (newer than every trial seen before it, and like the template; a fresh trial
        is RUNNING with nothing set)."""
        before: set[int] | None = None
        if self.resilience.tolerance_s > 0:
            before = {trial_id(t) for t in self.get_all_trials(study_id, deepcopy=False)}

        def landed() -> int | NotLanded:
            assert before is not None
            for t in self.inner.get_all_trials(study_id, deepcopy=False):
                if trial_id(t) in before:
                    continue
                if template_trial is None:
                    if t.state == TrialState.RUNNING and not t.params and not t.user_attrs:
                        return trial_id(t)
                elif _identity(t) == _identity(template_trial):
                    return trial_id(t)
            return NOT_LANDED

        return self.resilience.call(
            f"creating a trial of Optuna study id {study_id}",
            lambda: self.inner.create_new_trial(study_id, template_trial),
            landed=landed if before is not None else None,
        )

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        def landed() -> NotLanded | None:
            return None if param_name in self.inner.get_trial(trial_id).params else NOT_LANDED

        with self._lock:
            cached = self._cache.get(self._study_of.get(trial_id, -1))
            known = cached.distributions.get(param_name) if cached is not None else None
        # with the distribution this study already uses for the name, Optuna skips reading
        # it from the database to check the two are compatible (as its own cache does)
        self.resilience.call(
            f"setting {param_name} of trial id {trial_id}",
            lambda: self.inner._set_trial_param(
                trial_id, param_name, param_value_internal, distribution, known
            ),
            landed=landed,
        )
        if cached is not None and known is None:
            with self._lock:
                cached.distributions[param_name] = distribution

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            f"reading trial {trial_number}",
            lambda: self.inner.get_trial_id_from_study_id_trial_number(study_id, trial_number),
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        def landed() -> bool | NotLanded:
            t = self.inner.get_trial(trial_id)
            same = values is None or (t.values is not None and list(t.values) == list(values))
            return True if t.state == state and same else NOT_LANDED

        return self.resilience.call(
            f"setting trial id {trial_id} {state.name}",
            lambda: self.inner.set_trial_state_values(trial_id, state, values),
            landed=landed,
        )

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self._call(
            "reporting an intermediate value",
            lambda: self.inner.set_trial_intermediate_value(trial_id, step, intermediate_value),
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(
            f"setting {key} of trial id {trial_id}",
            lambda: self.inner.set_trial_user_attr(trial_id, key, value),
        )

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(
            f"setting {key} of trial id {trial_id}",
            lambda: self.inner.set_trial_system_attr(trial_id, key, value),
        )

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call(f"reading trial id {trial_id}", lambda: self.inner.get_trial(trial_id))

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        with self._lock:
            cached = self._cache.setdefault(study_id, _Cached())
            unfinished, last = set(cached.unfinished), cached.last_finished
        # what Optuna's own cache reads: the unfinished trials and every newer one
        fresh = self._call(
            "reading the study's trials",
            lambda: self.inner._get_trials(study_id, None, unfinished, last),
        )
        with self._lock:
            live: list[FrozenTrial] = []
            for t in fresh:
                self._study_of[trial_id(t)] = study_id
                for name, dist in t.distributions.items():
                    cached.distributions.setdefault(name, dist)
                if t.state.is_finished():
                    cached.finished[trial_id(t)] = t
                    cached.unfinished.discard(trial_id(t))
                else:
                    cached.unfinished.add(trial_id(t))
                    live.append(t)
            # newer ids than every finished one are read again; older unfinished ones are
            # read by id (Optuna's own cache keeps the same two)
            done = [trial_id(t) for t in fresh if t.state.is_finished()]
            cached.last_finished = max([cached.last_finished, *done])
            trials = sorted([*cached.finished.values(), *live], key=lambda t: t.number)
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._call("reading the best trial", lambda: self.inner.get_best_trial(study_id))
