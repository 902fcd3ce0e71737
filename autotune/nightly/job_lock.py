"""Held locks for long jobs (docs/nightly.md#7-locks): one nightly run per deployment, one
active scheduler per database. Unlike the study lock (:mod:`autotune.store.lock`, held for
one short section and waited for) these are tried once and held for the whole job; a second
taker gets :class:`~autotune.errors.BusyError` at once.

On PostgreSQL a session-level advisory lock on a connection of its own (a lost connection
releases it); on SQLite an exclusive ``flock`` on a file beside the database, the study
lock's way; an in-memory database is one process: a set of held names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator

from sqlalchemy import text
from sqlalchemy.engine import make_url

from autotune.errors import BusyError
from autotune.store import Store

__all__ = ["held_lock", "lock_key"]

_HELD: set[tuple[str, str]] = set()
_GUARD = threading.Lock()


def lock_key(name: str) -> int:
    """The PostgreSQL advisory-lock key of ``name`` (a signed 64-bit hash)."""
    digest = hashlib.blake2b(f"autotune-held:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def held_lock(store: Store, name: str, busy: str) -> Iterator[None]:
    """Hold the lock ``name`` for the block; ``busy`` is the one-line message a second
    taker gets."""
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect() as conn:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(name)})
            if not got.scalar():
                conn.rollback()
                raise BusyError(busy)
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key(name)})
                conn.commit()
        return
    database = make_url(store.url).database
    if not database or database == ":memory:":
        key = (store.url, name)
        with _GUARD:
            if key in _HELD:
                raise BusyError(busy)
            _HELD.add(key)
        try:
            yield
        finally:
            with _GUARD:
                _HELD.discard(key)
        return
    path = f"{database}.{_safe(name)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(busy) from None
        yield
    finally:
        os.close(fd)
