"""The study lock: what makes a claim exclusive among every controller of a study
(docs/faults.md#2-controllers-workers-and-claims).

On PostgreSQL a transaction-scoped advisory lock, and the claim row is written in the lock's
own transaction, so a claim made while the lock was lost to a server restart never commits.
On SQLite an exclusive ``flock`` on ``<database file>.lock``: a separate file, because
SQLite's own locks are POSIX locks, which closing any descriptor of the database file would
drop. Inside one process a thread lock is taken first, so several trial lanes of one
controller can share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from autotune.store.rows import ClaimRow

if TYPE_CHECKING:
    from autotune.store.claim_book import ClaimEntry
    from autotune.store.fleet import Fleet

__all__ = ["Locked", "lock_key", "study_lock"]

_LOCAL_LOCKS: dict[tuple[str, str], threading.RLock] = {}
_LOCAL_GUARD = threading.Lock()
_DEPTH = threading.local()


def lock_key(study_name: str) -> int:
    """The PostgreSQL advisory-lock key of a study (a signed 64-bit hash of its name)."""
    digest = hashlib.blake2b(f"autotune-study:{study_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Locked:
    """What a holder of the study lock may do: read and add claims (on PostgreSQL in the
    lock's own transaction, so a claim never outlives a lost lock)."""

    def __init__(self, fleet: Fleet, study_name: str, session: Session | None) -> None:
        self._fleet, self.study_name, self._session = fleet, study_name, session

    @contextlib.contextmanager
    def _s(self, what: str, *, write: bool = False) -> Iterator[Session]:
        if self._session is not None:
            yield self._session
        else:
            with self._fleet.store._session(what, write_lock=write) as s:
                yield s

    def claims(self) -> list[ClaimEntry]:
        with self._s("reading claims") as s:
            return self._fleet._claims(s, self.study_name)

    def add_claim(
        self,
        key: str,
        *,
        controller_id: int | None,
        trial_number: int | None = None,
        stage: str | None = None,
        lane: int = 0,
    ) -> None:
        with self._s(f"claiming {key}", write=True) as s:
            study_id = self._fleet.store.study_row_id(s, self.study_name)
            s.add(
                ClaimRow(
                    study_id=study_id,
                    key=key,
                    trial_number=trial_number,
                    stage=stage,
                    controller_id=controller_id,
                    lane=lane,
                    claimed_at=datetime.now(UTC),
                )
            )
            s.flush()


def _lock_file(fleet: Fleet) -> Path | None:
    if fleet.store.engine.dialect.name == "postgresql":
        return None
    database = make_url(fleet.store.url).database
    if not database or database == ":memory:":
        return None  # an in-memory database lives in one process: the thread lock will do
    return Path(f"{database}.lock")


@contextlib.contextmanager
def study_lock(fleet: Fleet, study_name: str) -> Iterator[Locked]:
    """Hold the study lock for one short, synchronous section (no awaits inside)."""
    store = fleet.store
    with _LOCAL_GUARD:
        local = _LOCAL_LOCKS.setdefault((store.url, study_name), threading.RLock())
    with local:
        depth = getattr(_DEPTH, "n", 0)
        _DEPTH.n = depth + 1
        try:
            if depth > 0:  # nested in this thread: the outer section holds the lock
                yield Locked(fleet, study_name, None)
            elif store.engine.dialect.name == "postgresql":
                with store._sessions.begin() as s:
                    s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key(study_name)})
                    yield Locked(fleet, study_name, s)
            else:
                with _flock(_lock_file(fleet)):
                    yield Locked(fleet, study_name, None)
        finally:
            _DEPTH.n = depth


@contextlib.contextmanager
def _flock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
