"""The study store: autotune's studies, trials and load levels in a SQL database.

The database is the one Optuna's RDB storage uses (same URL), so a study's Optuna state and
autotune's richer records live and die together; see :mod:`autotune.store.migrate` for how
the two schemas stay apart. Every method runs in its own transaction, so a failed call
leaves the database as it was, and every database problem surfaces as a one-line
:class:`StorageError` raised ``from`` the driver's error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, case, delete, func, inspect, or_, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from autotune.errors import StorageError
from autotune.store import migrate
from autotune.store._engine import (
    connect_error,
    is_unique_violation,
    make_engine,
    mask_url,
    normalize_url,
    one_line,
)
from autotune.store.models import LevelRow, StudyRow, TrialRow
from autotune.store.records import LevelRecord, StudyRecord, StudySummary, TrialRecord

__all__ = ["DEFAULT_URL", "ENV_VAR", "Store", "resolve_url"]

DEFAULT_URL = "sqlite:///autotune.db"
ENV_VAR = "AUTOTUNE_DATABASE_URL"

_STUDY_FIELDS = [f.name for f in dataclasses.fields(StudyRecord) if f.name != "id"]
_LEVEL_FIELDS = [f.name for f in dataclasses.fields(LevelRecord) if f.name != "id"]
_TRIAL_FIELDS = [f.name for f in dataclasses.fields(TrialRecord)
                 if f.name not in ("id", "study_name", "levels")]


def resolve_url(url: str | None) -> str:
    """The database URL to use: ``url`` if given, else ``$AUTOTUNE_DATABASE_URL``, else
    :data:`DEFAULT_URL` (a SQLite file in the working directory). ``postgresql://`` is
    spelled ``postgresql+psycopg://`` (psycopg 3 is the driver autotune ships with)."""
    return normalize_url(url or os.environ.get(ENV_VAR) or DEFAULT_URL)


class Store:
    """Read and write studies; open with :meth:`open`, finish with :meth:`close`."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url  # with its password: Optuna's storage is opened on the same URL
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | None = None, *, upgrade: bool | None = None) -> Store:
        """Connect and make sure our schema is current.

        ``upgrade=None`` upgrades SQLite automatically (a local file has no DBA) and only
        checks other backends, where schema changes are an explicit step
        (``autotune db upgrade``); ``True`` always upgrades, ``False`` only checks.
        """
        resolved = resolve_url(url)
        engine = make_engine(resolved)
        try:
            store = cls(resolved, engine)
            auto = engine.dialect.name == "sqlite" if upgrade is None else upgrade
            current = store._known_revision()
            head = migrate.head_revision()
            if current != head:
                if not auto:
                    where = mask_url(resolved)
                    state = "not initialised" if current is None else \
                        f"at schema revision {current}, this autotune needs {head}"
                    raise StorageError(f"database at {where} is {state}; "
                                       f"run `autotune db upgrade --storage {where}`")
                store.upgrade()
        except BaseException:
            engine.dispose()
            raise
        return store

    def upgrade(self) -> None:
        """Bring our tables to the newest revision (``alembic upgrade head``)."""
        self._known_revision()
        try:
            migrate.upgrade(self._engine)
        except SQLAlchemyError as exc:
            raise StorageError(f"upgrading the study database at {mask_url(self.url)} "
                               f"failed: {one_line(exc)}") from exc

    def _known_revision(self) -> str | None:
        """The current revision, refusing one this autotune does not ship (Alembic would
        only say it "can't locate" it)."""
        current = self.current_revision()
        if current is not None and current not in migrate.known_revisions():
            raise StorageError(
                f"database at {mask_url(self.url)} has autotune schema revision {current}, "
                "which this autotune does not know (it was written by a newer autotune); "
                "upgrade autotune")
        return current

    def current_revision(self) -> str | None:
        """Our schema's Alembic revision in the database, ``None`` if never upgraded."""
        try:
            with self._engine.connect() as conn:
                return migrate.current_revision(conn)
        except SQLAlchemyError as exc:
            raise connect_error(self.url, exc) from exc

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- studies ---------------------------------------------------------------------------

    def create_study(self, rec: StudyRecord) -> int:
        """Store a new study; StorageError if one of that name exists."""
        values = {k: getattr(rec, k) for k in _STUDY_FIELDS}
        values["created_at"] = rec.created_at or datetime.now(UTC)
        exists = StorageError(f"study {rec.name!r} already exists; use "
                              f"`autotune study run {rec.name}` or delete it")
        with self._session(f"creating study {rec.name!r}", on_conflict=exists) as s:
            if s.scalar(select(StudyRow.id).where(StudyRow.name == rec.name)) is not None:
                raise exists
            row = StudyRow(**values)
            s.add(row)
            s.flush()
            return row.id

    def get_study(self, name: str) -> StudyRecord | None:
        with self._session(f"reading study {name!r}") as s:
            row = s.scalar(select(StudyRow).where(StudyRow.name == name))
            if row is None:
                return None
            return StudyRecord(id=row.id, **{k: getattr(row, k) for k in _STUDY_FIELDS})

    def list_studies(self) -> list[StudySummary]:
        """All studies, oldest first, with trial counts and the best objective so far."""
        complete = TrialRow.state == "COMPLETE"
        counted = or_(TrialRow.feasible.is_(None), TrialRow.feasible.is_(True))
        query = (
            select(StudyRow.name, StudyRow.mode, StudyRow.worker_kind, StudyRow.created_at,
                   func.count(TrialRow.id), func.count(case((complete, 1))),
                   func.max(case((complete & counted, TrialRow.objective))))
            .outerjoin(TrialRow, TrialRow.study_id == StudyRow.id)
            .group_by(StudyRow.id, StudyRow.name, StudyRow.mode, StudyRow.worker_kind,
                      StudyRow.created_at)
            .order_by(StudyRow.created_at, StudyRow.id)
        )
        with self._session("listing studies") as s:
            return [StudySummary(*row) for row in s.execute(query).all()]

    def delete_study(self, name: str) -> None:
        """Delete a study, its trials and levels, and Optuna's study of the same DB.

        Optuna's goes first: if ours then fails, running the delete again finishes the job,
        whereas the other order could strand an Optuna study that blocks reusing the name.
        """
        rec = self.get_study(name)
        if rec is None:
            raise StorageError(f"study {name!r} does not exist (see `autotune study list`)")
        self._delete_optuna_study(rec.optuna_study_name)
        with self._session(f"deleting study {name!r}") as s:
            # The database cascades to trials and levels (foreign keys ON DELETE CASCADE).
            s.execute(delete(StudyRow).where(StudyRow.name == name))

    def _delete_optuna_study(self, optuna_name: str) -> None:
        try:
            if not inspect(self._engine).has_table("studies"):
                return  # Optuna never used this database (and opening it would create tables)
        except SQLAlchemyError as exc:
            raise connect_error(self.url, exc) from exc
        import optuna  # here, not at the top: importing Optuna costs about a second

        try:
            storage = optuna.storages.RDBStorage(self.url)
        except (RuntimeError, SQLAlchemyError) as exc:  # RuntimeError: Optuna schema too old
            raise StorageError(f"cannot open Optuna's storage at {mask_url(self.url)} to "
                               f"delete study {optuna_name!r}: {one_line(exc)}") from exc
        try:
            optuna.delete_study(study_name=optuna_name, storage=storage)
        except KeyError:
            pass  # no Optuna study yet: nothing to delete
        except SQLAlchemyError as exc:
            raise StorageError(f"deleting Optuna study {optuna_name!r} at "
                               f"{mask_url(self.url)} failed: {one_line(exc)}") from exc
        finally:
            storage.remove_session()
            storage.engine.dispose()

    # -- trials ----------------------------------------------------------------------------

    def add_trial(self, rec: TrialRecord) -> int:
        """Store a trial and its levels (all or nothing); returns the trial's id."""
        what = f"trial {rec.optuna_trial_number} of study {rec.study_name!r}"
        duplicate = StorageError(f"{what} already exists (or two of its levels share a "
                                 "level_index)")
        with self._session(f"adding {what}", on_conflict=duplicate) as s:
            study_id = self._study_id(s, rec.study_name)
            values = {k: getattr(rec, k) for k in _TRIAL_FIELDS}
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
            raise TypeError(f"update_trial() got unknown or read-only fields {unknown}; "
                            f"it accepts {_TRIAL_FIELDS}")
        with self._session(f"updating trial id {trial_id}") as s:
            row = s.get(TrialRow, trial_id)
            if row is None:
                raise StorageError(f"trial id {trial_id} does not exist")
            for key, value in fields.items():
                setattr(row, key, value)

    def add_level(self, trial_id: int, level: LevelRecord) -> int:
        """Add one load level to a stored trial; returns the level's id."""
        duplicate = StorageError(f"trial id {trial_id} already has level {level.level_index}")
        with self._session(f"adding a level to trial id {trial_id}", on_conflict=duplicate) as s:
            if s.get(TrialRow, trial_id) is None:
                raise StorageError(f"trial id {trial_id} does not exist")
            row = _level_row(level)
            row.trial_id = trial_id
            s.add(row)
            s.flush()
            return row.id

    def trials(self, study_name: str) -> list[TrialRecord]:
        """A study's trials by Optuna trial number, each with its levels in order."""
        with self._session(f"reading the trials of study {study_name!r}") as s:
            study_id = self._study_id(s, study_name)
            rows = s.scalars(select(TrialRow).where(TrialRow.study_id == study_id)
                             .order_by(TrialRow.optuna_trial_number)
                             .options(selectinload(TrialRow.levels))).all()
            return [_trial_record(row, study_name) for row in rows]

    # -- plumbing --------------------------------------------------------------------------

    @staticmethod
    def _study_id(s: Session, name: str) -> int:
        study_id = s.scalar(select(StudyRow.id).where(StudyRow.name == name))
        if study_id is None:
            raise StorageError(f"study {name!r} does not exist (see `autotune study list`)")
        return study_id

    @contextmanager
    def _session(self, action: str, on_conflict: StorageError | None = None
                 ) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error,
        with database errors turned into StorageError (``on_conflict`` for a unique
        violation, whose driver text names a constraint rather than what clashed)."""
        try:
            with self._sessions.begin() as s:
                yield s
        except IntegrityError as exc:
            if on_conflict is not None and is_unique_violation(exc):
                raise on_conflict from exc
            raise StorageError(f"{action} failed: {one_line(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"{action} failed at {mask_url(self.url)}: "
                               f"{one_line(exc)}") from exc


def _level_row(level: LevelRecord) -> LevelRow:
    return LevelRow(**{k: getattr(level, k) for k in _LEVEL_FIELDS})


def _trial_record(row: TrialRow, study_name: str) -> TrialRecord:
    levels = [LevelRecord(id=lv.id, **{k: getattr(lv, k) for k in _LEVEL_FIELDS})
              for lv in row.levels]
    return TrialRecord(id=row.id, study_name=study_name, levels=levels,
                       **{k: getattr(row, k) for k in _TRIAL_FIELDS})
