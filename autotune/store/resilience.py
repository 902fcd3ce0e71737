"""Riding out a database outage (docs/faults.md#4-database-outages).

A run's database calls go through :meth:`Resilience.call`: a transient error (the server
restarted, refused the connection, dropped it) is retried with bounded backoff until the
outage has lasted ``tolerance_s``; before a non-idempotent write is retried, its ``landed``
check asks the database whether the first attempt went through after all. An outage longer
than the tolerance ends in one :class:`~autotune.errors.DatabaseLostError` naming the
database. Every call shares one outage clock, so nested calls never wait twice.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from autotune.errors import DatabaseLostError
from autotune.store._engine import (
    disk_full_error,
    is_disconnect,
    is_disk_full,
    mask_url,
    one_line,
)

__all__ = ["NOT_LANDED", "NotLanded", "Resilience", "is_transient", "secondary_failure"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_FIRST_DELAY_S: Final = 0.1
_MAX_DELAY_S: Final = 2.0


class NotLanded:
    """What a ``landed`` check returns when the write did not go through."""


NOT_LANDED: Final = NotLanded()


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) means "the database cannot answer right now":
    unreachable, or (SQLite) locked by another writer."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DatabaseLostError):
            return False  # already given up on: never retried again by an outer call
        seen.add(id(cur))
        if isinstance(cur, SQLAlchemyError) and is_disconnect(cur):
            return True
        if any(
            c.__module__.startswith("psycopg") and c.__name__ == "OperationalError"
            for c in type(cur).__mro__
        ):
            return True
        # SQLite answers a writer that would deadlock (it holds a read lock another writer
        # waits on) at once, without its busy timeout: the whole transaction is retried
        if isinstance(cur, sqlite3.OperationalError) and "locked" in str(cur):
            return True
        # SQLAlchemy keeps the driver's error as .orig (and raises from it)
        cur = getattr(cur, "orig", None) or cur.__cause__ or cur.__context__
    return False


def _locked(exc: BaseException) -> bool:
    """Whether ``exc`` comes from SQLite's lock (another writer), not from a lost server."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, sqlite3.OperationalError) and "locked" in str(cur):
            return True
        cur = getattr(cur, "orig", None) or cur.__cause__ or cur.__context__
    return False


def _root(exc: BaseException) -> BaseException:
    """The driver-level error behind ``exc`` (Optuna wraps it in a StorageInternalError
    whose own text blames "invalid data in the commit")."""
    cur: BaseException | None = exc
    seen: set[int] = set()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, SQLAlchemyError):
            return cur
        cur = cur.__cause__ or cur.__context__
    return exc


class Resilience:
    """Retries database calls through outages up to ``tolerance_s`` (0: never retry)."""

    def __init__(self, url: str, tolerance_s: float = 0.0) -> None:
        self.url = url
        self.tolerance_s = tolerance_s
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._contended = False  # the current outage is SQLite's lock contention
        self._given_up = False
        # what a run reports: the outages it rode out and how long the longest lasted
        self.outages = 0
        self.longest_outage_s = 0.0

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is not None:
                lasted = time.monotonic() - self._down_since
                self.outages += 1
                self.longest_outage_s = max(self.longest_outage_s, lasted)
                level = logging.DEBUG if self._contended else logging.WARNING
                log.log(
                    level,
                    "the study database at %s was unreachable for %.1f s; ridden out",
                    mask_url(self.url),
                    lasted,
                )
            self._down_since = None
            self._given_up = False

    def _outage(self, exc: BaseException, what: str) -> float:
        """Seconds the current outage has lasted (starting it now if none is running)."""
        now = time.monotonic()
        with self._lock:
            if self._down_since is None:
                self._down_since = now
                # SQLite answering "locked" to one of several writers (parallel trial lanes,
                # the heartbeat thread) is contention, not a lost database: not worth a line
                self._contended = _locked(exc)
                # not a warning: an outage is one line when it ends, ridden out (above) or
                # past the tolerance (the run's error), never two
                # (docs/faults.md#4-database-outages)
                level = logging.DEBUG if self._contended else logging.INFO
                log.log(
                    level,
                    "lost the study database at %s while %s (%s); retrying",
                    mask_url(self.url),
                    what,
                    one_line(_root(exc)),
                )
            return now - self._down_since

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        landed: Callable[[], T | NotLanded] | None = None,
    ) -> T:
        """``fn()``, retried through an outage. ``what`` says what was being done, for the
        error ("adding trial 3 of study 'x'"); ``landed`` reads whether a failed attempt of a
        non-idempotent write went through (its result, or :data:`NOT_LANDED`)."""
        delay = _FIRST_DELAY_S
        while True:
            try:
                result = fn()
            except Exception as exc:
                if is_disk_full(exc):  # never transient (PostgreSQL's is an OperationalError)
                    raise disk_full_error(self.url, exc) from exc
                if self.tolerance_s <= 0 or not is_transient(exc):
                    raise
                self._wait_or_give_up(what, exc, delay)
                delay = min(delay * 2, _MAX_DELAY_S)
                if landed is not None:
                    found = self._check(landed)
                    if not isinstance(found, NotLanded):
                        self._recovered()
                        return found
                continue
            self._recovered()
            return result

    def _check(self, landed: Callable[[], T | NotLanded]) -> T | NotLanded:
        try:
            return landed()
        except Exception as exc:
            if not is_transient(exc):
                raise
            return NOT_LANDED  # still down: the next attempt waits again

    def _wait_or_give_up(self, what: str, exc: Exception, delay: float) -> None:
        lasted = self._outage(exc, what)
        if self._given_up or lasted >= self.tolerance_s:
            self._given_up = True  # later calls fail at once until the database answers
            raise DatabaseLostError(
                f"lost the study database at {mask_url(self.url)} for {lasted:.0f} s, longer "
                f"than the outage tolerance ({self.tolerance_s:g} s, "
                f"controller.db_outage_tolerance_s), while {what}: {one_line(_root(exc))}"
            ) from exc
        time.sleep(min(delay, self.tolerance_s - lasted))


def secondary_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """A failure beside the point of the error in flight (recording that a worker group is
    gone, failing an abandoned trial, a controller's end): one warning line, or none when
    the database is lost past the outage tolerance, which the run reports itself in its one
    line (docs/faults.md#4-database-outages). The traceback goes to the log at debug level
    either way."""
    if not isinstance(exc, DatabaseLostError):
        logger.warning("%s: %s", what, one_line(exc))
    logger.debug("%s", what, exc_info=exc)
