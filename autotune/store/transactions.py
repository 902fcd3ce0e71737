"""One database's transactions: the session every store method runs in, its retries
through outages, and the masking of secrets before anything is written.

:class:`StoreBase` is what :class:`autotune.store.db.Store`, the stores of its records
(:mod:`autotune.store.trial_store`, :mod:`autotune.store.repeat_store`) and
:mod:`autotune.store.fleet` share. Every method runs in its own transaction, so a failed
call leaves the database as it was, and every database problem surfaces as a one-line
:class:`StorageError` raised ``from`` the driver's error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from autotune.errors import NotFoundError, ServiceError, StorageError
from autotune.redact import mask_argv, mask_command, mask_text
from autotune.store._engine import (
    SQLITE_BEGIN,
    disk_full_error,
    is_disconnect,
    is_disk_full,
    is_unique_violation,
    mask_url,
    one_line,
)
from autotune.store.resilience import NotLanded, Resilience
from autotune.store.rows import StudyRow

if TYPE_CHECKING:
    from autotune.store.optuna_storage import ResilientStorage

T = TypeVar("T")

__all__ = ["StoreBase", "masked"]


def masked(values: dict[str, Any]) -> dict[str, Any]:
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


class StoreBase:
    """A database's engine and sessions; :class:`autotune.store.db.Store` is the whole store."""

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

    @property
    def engine(self) -> Engine:
        return self._engine

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
