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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, case, delete, func, inspect, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, lazyload, selectinload, sessionmaker

from autotune.errors import NotFoundError, ServiceError, StorageError
from autotune.redact import mask_argv, mask_command, mask_text
from autotune.store import migrate
from autotune.store._engine import (
    SQLITE_BEGIN,
    connect_error,
    disk_full_error,
    is_disconnect,
    is_disk_full,
    is_unique_violation,
    make_engine,
    mask_url,
    normalize_url,
    one_line,
    optuna_engine_kwargs,
    sqlite_path,
)
from autotune.store.models import LevelRow, RepeatRow, StudyRow, TrialRow
from autotune.store.records import (
    LevelRecord,
    RepeatRecord,
    StudyRecord,
    StudySummary,
    TrialRecord,
)
from autotune.store.resilience import NOT_LANDED, NotLanded, Resilience

if TYPE_CHECKING:
    from autotune.store.fleet import Fleet
    from autotune.store.optuna_storage import ResilientStorage

T = TypeVar("T")

__all__ = ["DEFAULT_URL", "ENV_VAR", "NoDatabaseError", "Store", "resolve_url"]

DEFAULT_URL = "sqlite:///autotune.db"
ENV_VAR = "AUTOTUNE_DATABASE_URL"

_STUDY_FIELDS = [f.name for f in dataclasses.fields(StudyRecord) if f.name != "id"]
_LEVEL_FIELDS = [f.name for f in dataclasses.fields(LevelRecord) if f.name != "id"]
_REPEAT_FIELDS = [
    f.name for f in dataclasses.fields(RepeatRecord) if f.name not in ("id", "study_name")
]
_TRIAL_FIELDS = [
    f.name for f in dataclasses.fields(TrialRecord) if f.name not in ("id", "study_name", "levels")
]


def _masked(values: dict[str, Any]) -> dict[str, Any]:
    """Secrets never reach the database: secret flag values and URL passwords are masked in
    launch commands, log tails and configs (autotune.redact) whoever writes them."""
    out = dict(values)
    if out.get("launch_command"):
        out["launch_command"] = mask_command(out["launch_command"])
    if out.get("launch_argv"):
        out["launch_argv"] = mask_argv(out["launch_argv"])
    for key in ("log_tail", "config_yaml"):
        if out.get(key):
            out[key] = mask_text(out[key])
    return out


class NoDatabaseError(NotFoundError):
    """A command that reads named a SQLite file that does not exist (nothing was created)."""


def _need_existing_sqlite(url: str) -> None:
    """Refuse, without creating it, a SQLite database file that does not exist (connecting
    would create an empty one). In-memory databases and server URLs pass."""
    path = sqlite_path(url)
    if path is None or path.exists():
        return
    where = mask_url(url)
    if not path.parent.is_dir():
        raise StorageError(
            f"cannot open the study database at {where}: the folder {path.parent} "
            "does not exist; check the path"
        )
    raise NoDatabaseError(
        f"no study database at {where} (nothing was stored there yet; "
        "`autotune study create --config FILE` creates one)"
    )


def resolve_url(url: str | None) -> str:
    """The database URL to use: ``url`` if given, else ``$AUTOTUNE_DATABASE_URL``, else
    :data:`DEFAULT_URL` (a SQLite file in the working directory). ``postgresql://`` is
    spelled ``postgresql+psycopg://`` (psycopg 3 is the driver autotune ships with)."""
    # an empty ``url`` is refused by normalize_url, not replaced by the default
    return normalize_url(url if url is not None else os.environ.get(ENV_VAR) or DEFAULT_URL)


class Store:
    """Read and write studies; open with :meth:`open`, finish with :meth:`close`."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url  # with its password: Optuna's storage is opened on the same URL
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # SQLite: a write that reads first (the study's id) and would deadlock with another
        # writer gets "database is locked" at once; BEGIN IMMEDIATE queues it instead. For
        # the claim, whose retry would leave its asked trial orphaned
        # (docs/parallel.md#5-several-hosts).
        self._write_sessions = sessionmaker(
            engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
            if engine.dialect.name == "sqlite"
            else engine,
            expire_on_commit=False,
        )
        self._optuna: ResilientStorage | None = None
        # retries through database outages; off (0 s) until a run sets its tolerance
        self.resilience = Resilience(url)

    @classmethod
    def open(
        cls, url: str | None = None, *, upgrade: bool | None = None, create: bool = True
    ) -> Store:
        """Connect and make sure our schema is current.

        ``upgrade=None`` upgrades SQLite automatically (a local file has no DBA) and only
        checks other backends, where schema changes are an explicit step
        (``autotune db upgrade``); ``True`` always upgrades, ``False`` only checks.

        ``create=False`` (list, show, best, export, delete, report, dashboard) never creates
        a database: a SQLite file that does not exist raises :class:`NoDatabaseError` before
        SQLite could create it, and a database without autotune's tables is not initialised
        (an existing SQLite file at an older revision is still upgraded in place).
        """
        resolved = resolve_url(url)
        if not create:
            _need_existing_sqlite(resolved)
        engine = make_engine(resolved)
        try:
            store = cls(resolved, engine)
            auto = engine.dialect.name == "sqlite" if upgrade is None else upgrade
            current = store._known_revision()
            head = migrate.head_revision()
            if not create and current is None:
                auto = False  # initialising the schema would create the database
            if current != head:
                if not auto:
                    where = mask_url(resolved)
                    state = (
                        "not initialised"
                        if current is None
                        else f"at schema revision {current}, this autotune needs {head}"
                    )
                    raise StorageError(
                        f"database at {where} is {state}; "
                        f"run `autotune db upgrade --storage {where}`"
                    )
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
            raise StorageError(
                f"upgrading the study database at {mask_url(self.url)} failed: {one_line(exc)}"
            ) from exc

    def _known_revision(self) -> str | None:
        """The current revision, refusing one this autotune does not ship (Alembic would
        only say it "can't locate" it)."""
        current = self.current_revision()
        if current is not None and current not in migrate.known_revisions():
            raise StorageError(
                f"database at {mask_url(self.url)} has autotune schema revision {current}, "
                "which this autotune does not know (it was written by a newer autotune); "
                "upgrade autotune"
            )
        return current

    def current_revision(self) -> str | None:
        """Our schema's Alembic revision in the database, ``None`` if never upgraded."""
        try:
            with self._engine.connect() as conn:
                return migrate.current_revision(conn)
        except SQLAlchemyError as exc:
            raise connect_error(self.url, exc) from exc

    def optuna_storage(self) -> ResilientStorage:
        """Optuna's storage on this database: built once per store and reused.

        ``optuna.create_study(storage=url)`` would build a new engine (and connection pool)
        on every call and never dispose of it; one shared storage, disposed by
        :meth:`close`, keeps a process to one pool per database. It shares this store's
        :attr:`resilience` (docs/faults.md#4-database-outages).
        """
        if self._optuna is None:
            # here, not at the top: importing Optuna costs about a second
            import optuna

            from autotune.store.optuna_storage import ResilientStorage

            try:
                inner = optuna.storages.RDBStorage(
                    self.url, engine_kwargs=optuna_engine_kwargs(self.url)
                )
            except (RuntimeError, SQLAlchemyError) as exc:  # RuntimeError: schema too old
                if is_disk_full(exc):  # Optuna creates its tables here
                    raise disk_full_error(self.url, exc) from exc
                raise StorageError(
                    f"cannot open Optuna's storage at {mask_url(self.url)}: {one_line(exc)}"
                ) from exc
            self._optuna = ResilientStorage(inner, self.resilience)
        return self._optuna

    def fleet(self) -> Fleet:
        """The controllers, workers and claims of this database's studies."""
        from autotune.store.fleet import Fleet

        return Fleet(self)

    def set_outage_tolerance(self, seconds: float) -> None:
        """Retry through database outages of up to ``seconds`` (0: fail at once)."""
        self.resilience.tolerance_s = seconds

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        if self._optuna is not None:
            self._optuna.close()
            self._optuna = None
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- studies ---------------------------------------------------------------------------

    def create_study(self, rec: StudyRecord) -> int:
        """Store a new study; StorageError if one of that name exists."""
        values = _masked({k: getattr(rec, k) for k in _STUDY_FIELDS})
        values["created_at"] = rec.created_at or datetime.now(UTC)
        exists = StorageError(
            f"study {rec.name!r} already exists; use `autotune study run {rec.name}` or delete it"
        )
        with self._session(f"creating study {rec.name!r}", on_conflict=exists) as s:
            if s.scalar(select(StudyRow.id).where(StudyRow.name == rec.name)) is not None:
                raise exists
            row = StudyRow(**values)
            s.add(row)
            s.flush()
            return row.id

    def get_study(self, name: str) -> StudyRecord | None:
        return self._retrying(f"reading study {name!r}", lambda: self._get_study(name))

    def _get_study(self, name: str) -> StudyRecord | None:
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
            select(
                StudyRow.name,
                StudyRow.mode,
                StudyRow.worker_kind,
                StudyRow.created_at,
                func.count(TrialRow.id),
                func.count(case((complete, 1))),
                func.max(case((complete & counted, TrialRow.objective))),
            )
            .outerjoin(TrialRow, TrialRow.study_id == StudyRow.id)
            .group_by(
                StudyRow.id, StudyRow.name, StudyRow.mode, StudyRow.worker_kind, StudyRow.created_at
            )
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
            raise NotFoundError(f"study {name!r} does not exist (see `autotune study list`)")
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

        storage = self.optuna_storage()
        try:
            optuna.delete_study(study_name=optuna_name, storage=storage)
        except KeyError:
            pass  # no Optuna study yet: nothing to delete
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            raise StorageError(
                f"deleting Optuna study {optuna_name!r} at "
                f"{mask_url(self.url)} failed: {one_line(exc)}"
            ) from exc

    # -- trials ----------------------------------------------------------------------------

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
            values = _masked({k: getattr(rec, k) for k in _TRIAL_FIELDS})
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
            for key, value in _masked(fields).items():
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

    # -- validation repeats (docs/tuning.md#7-validation) ------------------------------------

    def add_repeats(self, recs: Sequence[RepeatRecord]) -> list[int]:
        """Store validation runs (all or nothing; a study's plan is added at once); returns
        their ids. StorageError when one of them (study, repeat, trial) exists already."""
        if not recs:
            return []
        name = recs[0].study_name
        return self._retrying(
            f"adding validation runs to study {name!r}",
            lambda: self._add_repeats(recs),
            landed=lambda: [r.id for r in self.repeats(name) if r.id is not None] or NOT_LANDED,
        )

    def _add_repeats(self, recs: Sequence[RepeatRecord]) -> list[int]:
        name = recs[0].study_name
        duplicate = StorageError(f"study {name!r} already has a validation plan")
        with self._session(f"adding validation runs to study {name!r}", duplicate) as s:
            ids: dict[str, int] = {}
            rows = []
            for rec in recs:
                if rec.study_name not in ids:
                    ids[rec.study_name] = self.study_row_id(s, rec.study_name)
                values = {k: getattr(rec, k) for k in _REPEAT_FIELDS}
                rows.append(RepeatRow(study_id=ids[rec.study_name], **values))
            s.add_all(rows)
            s.flush()
            return [row.id for row in rows]

    def update_repeat(self, repeat_id: int, **fields: Any) -> None:
        """Set some of a validation run's fields (``state``, its results, timestamps)."""
        unknown = sorted(set(fields) - set(_REPEAT_FIELDS))
        if unknown:
            raise TypeError(
                f"update_repeat() got unknown fields {unknown}; it accepts {_REPEAT_FIELDS}"
            )
        self._retrying(
            f"updating validation run id {repeat_id}",
            lambda: self._update_repeat(repeat_id, fields),
        )

    def _update_repeat(self, repeat_id: int, fields: dict[str, Any]) -> None:
        with self._session(f"updating validation run id {repeat_id}") as s:
            row = s.get(RepeatRow, repeat_id)
            if row is None:
                raise StorageError(f"validation run id {repeat_id} does not exist")
            for key, value in fields.items():
                setattr(row, key, value)

    def claim_repeat(self, repeat_id: int) -> bool:
        """Move a PENDING validation run to RUNNING, for exactly one caller however many
        controllers race for it: one conditional UPDATE, atomic on SQLite and PostgreSQL
        alike (docs/tuning.md#7-validation). False when another controller has it."""

        def claim() -> bool:
            with self._session(f"claiming validation run id {repeat_id}") as s:
                done = s.execute(
                    update(RepeatRow)
                    .where(RepeatRow.id == repeat_id, RepeatRow.state == "PENDING")
                    .values(state="RUNNING", started_at=datetime.now(UTC))
                )
                return bool(done.rowcount == 1)  # type: ignore[attr-defined]

        return self._retrying(f"claiming validation run id {repeat_id}", claim)

    def repeats(self, study_name: str) -> list[RepeatRecord]:
        """A study's validation runs in the order they are run (repeat, then position)."""
        with self._session(f"reading the validation runs of study {study_name!r}") as s:
            study_id = self.study_row_id(s, study_name)
            rows = s.scalars(
                select(RepeatRow)
                .where(RepeatRow.study_id == study_id)
                .order_by(RepeatRow.repeat_index, RepeatRow.position)
            ).all()
            return [
                RepeatRecord(
                    id=row.id,
                    study_name=study_name,
                    **{k: getattr(row, k) for k in _REPEAT_FIELDS},
                )
                for row in rows
            ]

    # -- plumbing --------------------------------------------------------------------------

    def _retrying(
        self,
        what: str,
        fn: Callable[[], T],
        landed: Callable[[], T | NotLanded] | None = None,
    ) -> T:
        return self.resilience.call(what, fn, landed=landed)

    @staticmethod
    def study_row_id(s: Session, name: str) -> int:
        """The id of autotune's row of study ``name`` (not Optuna's study id)."""
        study_id = s.scalar(select(StudyRow.id).where(StudyRow.name == name))
        if study_id is None:
            raise NotFoundError(f"study {name!r} does not exist (see `autotune study list`)")
        return study_id

    @contextmanager
    def _session(
        self, action: str, on_conflict: StorageError | None = None, *, write_lock: bool = False
    ) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error,
        with database errors turned into StorageError (``on_conflict`` for a unique
        violation, whose driver text names a constraint rather than what clashed).
        ``write_lock``: on SQLite, take the write lock at the start."""
        try:
            with (self._write_sessions if write_lock else self._sessions).begin() as s:
                yield s
        except IntegrityError as exc:
            if on_conflict is not None and is_unique_violation(exc):
                raise on_conflict from exc
            raise StorageError(f"{action} failed: {one_line(exc)}") from exc
        except SQLAlchemyError as exc:
            if is_disk_full(exc):
                raise disk_full_error(self.url, exc) from exc
            if is_disconnect(exc):
                raise ServiceError(
                    f"{action} failed: lost the study database at {mask_url(self.url)}: "
                    f"{one_line(exc)}"
                ) from exc
            raise StorageError(f"{action} failed at {mask_url(self.url)}: {one_line(exc)}") from exc


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
