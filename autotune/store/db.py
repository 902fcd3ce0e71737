"""The study store: autotune's studies, trials and load levels in a SQL database.

The database is the one Optuna's RDB storage uses (same URL), so a study's Optuna state and
autotune's richer records live and die together; see :mod:`autotune.store.migrate` for how
the two schemas stay apart. :class:`Store` opens the database, checks its schema and holds
the studies; its trials and levels come from :mod:`autotune.store.trial_store`, its
validation runs from :mod:`autotune.store.repeat_store`, the levels' per-request records
from :mod:`autotune.store.request_store`, and the transaction every method
runs in from :mod:`autotune.store.transactions`.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import case, delete, func, inspect, or_, select
from sqlalchemy.exc import SQLAlchemyError

from autotune.errors import NotFoundError, StorageError
from autotune.store import migrate
from autotune.store._engine import (
    connect_error,
    disk_full_error,
    is_disk_full,
    make_engine,
    mask_url,
    normalize_url,
    one_line,
    optuna_engine_kwargs,
    sqlite_path,
)
from autotune.store.records import StudyRecord, StudySummary
from autotune.store.repeat_store import RepeatStore
from autotune.store.request_store import RequestStore
from autotune.store.rows import StudyRow, TrialRow
from autotune.store.transactions import masked
from autotune.store.trial_store import TrialStore

if TYPE_CHECKING:
    from autotune.store.fleet import Fleet
    from autotune.store.optuna_storage import ResilientStorage

__all__ = ["DEFAULT_URL", "ENV_VAR", "NoDatabaseError", "Store", "resolve_url"]

DEFAULT_URL = "sqlite:///autotune.db"
ENV_VAR = "AUTOTUNE_DATABASE_URL"

_STUDY_FIELDS = [f.name for f in dataclasses.fields(StudyRecord) if f.name != "id"]


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


class Store(TrialStore, RepeatStore, RequestStore):
    """Read and write studies; open with :meth:`open`, finish with :meth:`close`."""

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
        values = masked({k: getattr(rec, k) for k in _STUDY_FIELDS})
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

    # -- plumbing --------------------------------------------------------------------------
