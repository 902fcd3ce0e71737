"""The store's trials and their load levels: add, update, read. A write retried through an
outage first looks for what the first attempt may have landed
(docs/faults.md#4-database-outages)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import lazyload, selectinload

from autotune.errors import StorageError
from autotune.store.records import LevelRecord, TrialRecord
from autotune.store.resilience import NOT_LANDED, NotLanded
from autotune.store.rows import LevelRow, StudyRow, TrialRow
from autotune.store.transactions import StoreBase, masked

__all__ = ["TrialStore"]

_LEVEL_FIELDS = [f.name for f in dataclasses.fields(LevelRecord) if f.name != "id"]
_TRIAL_FIELDS = [
    f.name for f in dataclasses.fields(TrialRecord) if f.name not in ("id", "study_name", "levels")
]


class TrialStore(StoreBase):
    """Trials and levels (part of :class:`autotune.store.db.Store`)."""

    def add_trial(self, rec: TrialRecord) -> int:
        """Store a trial and its levels (all or nothing); returns the trial's id. Retried
        through an outage; a retry first looks for the trial (did the first attempt land?)."""
        return self._retrying(
            f"adding trial {rec.optuna_trial_number} of study {rec.study_name!r}",
            lambda: self._add_trial(rec),
            landed=lambda: self._trial_row_id(rec.study_name, rec.optuna_trial_number),
        )

    def _trial_row_id(self, study_name: str, number: int) -> int | NotLanded:
        with self._session(f"looking for trial {number} of study {study_name!r}") as s:
            found = s.scalar(
                select(TrialRow.id)
                .join(StudyRow, StudyRow.id == TrialRow.study_id)
                .where(StudyRow.name == study_name, TrialRow.optuna_trial_number == number)
            )
            return NOT_LANDED if found is None else int(found)

    def _add_trial(self, rec: TrialRecord) -> int:
        what = f"trial {rec.optuna_trial_number} of study {rec.study_name!r}"
        duplicate = StorageError(
            f"{what} already exists (or two of its levels share a level_index)"
        )
        with self._session(f"adding {what}", on_conflict=duplicate) as s:
            study_id = self.study_row_id(s, rec.study_name)
            values = masked({k: getattr(rec, k) for k in _TRIAL_FIELDS})
            values["started_at"] = rec.started_at or datetime.now(UTC)
            row = TrialRow(study_id=study_id, **values)
            row.levels = [_level_row(level) for level in rec.levels]
            s.add(row)
            s.flush()
            return row.id

    def update_trial(self, trial_id: int, **fields: Any) -> None:
        """Set some of a trial's fields (``state``, ``objective``, ``finished_at``, ...)."""
        unknown = sorted(set(fields) - set(_TRIAL_FIELDS))
        if unknown:  # a caller bug, not a database problem: fail like a bad keyword would
            raise TypeError(
                f"update_trial() got unknown or read-only fields {unknown}; "
                f"it accepts {_TRIAL_FIELDS}"
            )
        self._retrying(
            f"updating trial id {trial_id}", lambda: self._update_trial(trial_id, fields)
        )

    def _update_trial(self, trial_id: int, fields: dict[str, Any]) -> None:
        with self._session(f"updating trial id {trial_id}") as s:
            row = s.get(TrialRow, trial_id)
            if row is None:
                raise StorageError(f"trial id {trial_id} does not exist")
            for key, value in masked(fields).items():
                setattr(row, key, value)

    def add_level(self, trial_id: int, level: LevelRecord) -> int:
        """Add one load level to a stored trial; returns the level's id (retried through an
        outage like :meth:`add_trial`)."""
        return self._retrying(
            f"adding level {level.level_index} to trial id {trial_id}",
            lambda: self._add_level(trial_id, level),
            landed=lambda: self._level_id(trial_id, level.level_index),
        )

    def _level_id(self, trial_id: int, index: int) -> int | NotLanded:
        with self._session(f"looking for level {index} of trial id {trial_id}") as s:
            found = s.scalar(
                select(LevelRow.id).where(
                    LevelRow.trial_id == trial_id, LevelRow.level_index == index
                )
            )
            return NOT_LANDED if found is None else int(found)

    def _add_level(self, trial_id: int, level: LevelRecord) -> int:
        duplicate = StorageError(f"trial id {trial_id} already has level {level.level_index}")
        with self._session(f"adding a level to trial id {trial_id}", on_conflict=duplicate) as s:
            if s.get(TrialRow, trial_id) is None:
                raise StorageError(f"trial id {trial_id} does not exist")
            row = _level_row(level)
            row.trial_id = trial_id
            s.add(row)
            s.flush()
            return row.id

    def trials(self, study_name: str, *, with_levels: bool = True) -> list[TrialRecord]:
        """A study's trials by Optuna trial number, each with its levels in order (none with
        ``with_levels=False``, a quicker read)."""
        return self._retrying(
            f"reading the trials of study {study_name!r}",
            lambda: self._trials(study_name, with_levels),
        )

    def _trials(self, study_name: str, with_levels: bool) -> list[TrialRecord]:
        with self._session(f"reading the trials of study {study_name!r}") as s:
            study_id = self.study_row_id(s, study_name)
            load = selectinload(TrialRow.levels) if with_levels else lazyload(TrialRow.levels)
            rows = s.scalars(
                select(TrialRow)
                .where(TrialRow.study_id == study_id)
                .order_by(TrialRow.optuna_trial_number)
                .options(load)
            ).all()
            return [_trial_record(row, study_name, with_levels) for row in rows]


def _level_row(level: LevelRecord) -> LevelRow:
    return LevelRow(**{k: getattr(level, k) for k in _LEVEL_FIELDS})


def _trial_record(row: TrialRow, study_name: str, with_levels: bool = True) -> TrialRecord:
    # without levels the relationship is never touched (it would load them one trial at a time)
    levels = (
        [LevelRecord(id=lv.id, **{k: getattr(lv, k) for k in _LEVEL_FIELDS}) for lv in row.levels]
        if with_levels
        else []
    )
    return TrialRecord(
        id=row.id,
        study_name=study_name,
        levels=levels,
        **{k: getattr(row, k) for k in _TRIAL_FIELDS},
    )
