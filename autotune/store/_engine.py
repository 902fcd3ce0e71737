"""Engines for the study database: URL normalising and masking, SQLite set-up, and the
translation of driver errors into one-line :class:`StorageError` messages."""

from __future__ import annotations

import errno
import re
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, StatementError

from autotune.errors import ServiceError, StorageError
from autotune.inputs import clean_url

# Execution option read by the SQLite "begin" hook: "IMMEDIATE" takes the write lock at
# BEGIN, so two processes upgrading one fresh file queue up instead of one failing.
SQLITE_BEGIN = "autotune_sqlite_begin"
# A dead or firewalled PostgreSQL host should fail in seconds, not hang the CLI.
PG_CONNECT_TIMEOUT_S = 10
# Optuna and autotune may write to one SQLite file at once; wait for the lock a while.
SQLITE_BUSY_TIMEOUT_S = 30

_URL_HINT = "e.g. sqlite:///autotune.db or postgresql+psycopg://user@host:5432/autotune"


def normalize_url(url: str) -> str:
    """Check ``url`` parses, and spell PostgreSQL with psycopg 3.

    A bare ``postgresql://`` (or Heroku-style ``postgres://``) makes SQLAlchemy load
    psycopg2, which autotune does not depend on; Optuna is handed the same URL, so both
    get ``postgresql+psycopg://``. Surrounding whitespace is dropped (a trailing newline in
    $AUTOTUNE_DATABASE_URL once named a new SQLite file); control characters are refused.
    """
    try:
        url = clean_url(url)
    except ValueError as exc:
        raise StorageError(f"the study database setting {exc} ({_URL_HINT})") from None
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        # The text is not echoed: it may hold a password that could not be located.
        raise StorageError(
            f"the study database setting is not a database URL ({_URL_HINT})"
        ) from exc
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (None for other backends and in-memory databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    db = parsed.database or ""
    if db in ("", ":memory:") or db.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(db)


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable URL>"


def one_line(exc: BaseException) -> str:
    """The driver's own message, first line only, whitespace collapsed."""
    # SQLAlchemy's own text adds the SQL and a link; the wrapped error says what went wrong.
    orig = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    text = re.sub(r"\s+", " ", lines[0]) if lines else type(orig).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def is_unique_violation(exc: DBAPIError) -> bool:
    """Whether ``exc`` is a UNIQUE violation (PostgreSQL SQLSTATE 23505, or SQLite's text)."""
    return getattr(exc.orig, "sqlstate", None) == "23505" or "UNIQUE constraint failed" in str(
        exc.orig
    )


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` means the database server went away (not a failed statement)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    # psycopg raises OperationalError (or a subclass: AdminShutdown while the server stops,
    # CannotConnectNow while it starts) for a refused, dropped or timed-out connection
    return any(
        cls.__module__.startswith("psycopg")
        and cls.__name__ in ("OperationalError", "InterfaceError")
        for cls in type(orig).__mro__
    )


# What a PostgreSQL server answers (libpq's "FATAL:" text; psycopg gives no SQLSTATE for a
# failed connection) when it is up but refuses these credentials or this database: a wrong
# URL, not an outage, so a config error (exit 1) rather than "unreachable" (exit 5).
_REFUSED_LOGIN = re.compile(
    r'(role|database) "[^"]*" does not exist|authentication failed|no pg_hba\.conf entry'
)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it: SQLAlchemy's ``.orig``, ``__cause__``, ``__context__``."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not seen for seen in out):
        out.append(cur)
        cur = getattr(cur, "orig", None) or cur.__cause__ or cur.__context__
    return out


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says the disk is full: SQLite's SQLITE_FULL, PostgreSQL's
    SQLSTATE 53100 (disk_full), or an OSError ENOSPC. Optuna wraps these in a
    StorageInternalError whose text blames "invalid data ... exceeding max length"."""
    return _disk_full_cause(exc) is not None


def _disk_full_cause(exc: BaseException) -> BaseException | None:
    for cur in _chain(exc):
        if isinstance(cur, sqlite3.Error) and getattr(cur, "sqlite_errorcode", None) == 13:
            return cur  # SQLITE_FULL: "database or disk is full"
        if getattr(cur, "sqlstate", None) == "53100":
            return cur
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC:
            return cur
    return None


def disk_full_error(url: str, exc: BaseException) -> StorageError:
    """The one line for a write the full disk refused (what :func:`is_disk_full` detects)."""
    cause = _disk_full_cause(exc) or exc
    return StorageError(
        f"the study database at {mask_url(url)} is full (no space left on its disk: "
        f"{one_line(cause)}); free some space and run the command again"
    )


def connect_error(url: str, exc: BaseException) -> StorageError | ServiceError:
    """The error for a database that cannot be reached or opened at all: a SQLite file that
    cannot be opened is a path problem (StorageError); a server that refuses the URL's role,
    password or database is a wrong setting (StorageError); a server that cannot be reached
    is an unreachable service (ServiceError, exit code 5)."""
    if not url.startswith("sqlite") and _REFUSED_LOGIN.search(str(getattr(exc, "orig", exc))):
        return StorageError(
            f"the database server at {mask_url(url)} refused the connection: "
            f"{one_line(exc)}; check the user, password and database name in the URL "
            "(--storage or AUTOTUNE_DATABASE_URL)"
        )
    if url.startswith("sqlite"):
        return StorageError(
            f"cannot open the study database at {mask_url(url)}: "
            f"{one_line(exc)}; check the path (its folder must exist and be "
            "writable)"
        )
    return ServiceError(
        f"cannot connect to the study database at {mask_url(url)}: "
        f"{one_line(exc)}; check that the server is running and the URL is "
        "right (--storage or AUTOTUNE_DATABASE_URL)"
    )


def engine_kwargs(url: str) -> dict[str, Any]:
    """``create_engine`` keywords for ``url``: pre-ping and a connect timeout on PostgreSQL
    (a long study outlives server restarts; a dead host fails in seconds), a busy timeout
    on SQLite (Optuna and autotune may write to one file at once)."""
    parsed = make_url(url)
    kwargs: dict[str, Any] = {}
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        kwargs["pool_pre_ping"] = True
        if "connect_timeout" not in parsed.query:
            kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    elif backend == "sqlite" and "timeout" not in parsed.query:
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    return kwargs


def optuna_engine_kwargs(url: str) -> dict[str, Any]:
    """The same for Optuna's RDBStorage, with a bounded pool: one controller needs few
    connections, and many controllers share one PostgreSQL server."""
    kwargs = engine_kwargs(url)
    if make_url(url).get_backend_name() == "postgresql":
        kwargs.update(pool_size=2, max_overflow=3)
    return kwargs


def make_engine(url: str) -> Engine:
    """An engine for ``url`` (already normalised); StorageError if it cannot be used."""
    try:
        engine = create_engine(make_url(url), **engine_kwargs(url))
    except (ImportError, NoSuchModuleError, ArgumentError) as exc:
        raise StorageError(
            f"cannot use the study database URL {mask_url(url)}: {one_line(exc)} ({_URL_HINT})"
        ) from exc
    if engine.dialect.name == "sqlite":
        _setup_sqlite(engine)
    return engine


def _setup_sqlite(engine: Engine) -> None:
    """Real transactions and enforced foreign keys on SQLite.

    pysqlite starts transactions itself and only before DML, so DDL would run outside them
    (a failed migration could leave half a schema) and SAVEPOINTs misbehave; SQLAlchemy's
    documented fix is to switch that off and emit BEGIN from the "begin" event. Foreign keys
    are off by default in SQLite; they carry the cascade from a study to its trials/levels.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN, "")
        connection.exec_driver_sql(f"BEGIN {mode}".rstrip())
