"""Opening the study database for a command (``--storage``, ``$AUTOTUNE_DATABASE_URL``, the
config's ``storage``), finding a study in it, and ``autotune db upgrade``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from autotune.cli._app import db_app
from autotune.errors import NotFoundError, StorageError
from autotune.store import NoDatabaseError, Store, StudyRecord, resolve_url
from autotune.store.db import ENV_VAR

__all__ = ["StorageOpt", "need_study", "open_store", "study_store", "upgrade"]


StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help=f"database URL (default: ${ENV_VAR}, the config's, or sqlite:///autotune.db)",
    ),
]


def _quiet_optuna() -> None:
    # Optuna logs every study creation at INFO on stderr; our own output says what happened.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _url(storage: str | None, config_storage: str | None = None) -> str | None:
    """The database setting that applies (--storage, $AUTOTUNE_DATABASE_URL, the config's);
    one that is not a URL is refused naming the setting it came from."""
    if storage is not None and not storage.strip():
        # an empty --storage once fell back to the default SQLite file without a word
        raise typer.BadParameter("is empty; give a database URL", param_hint="'--storage'")
    url, origin = (
        (storage, "--storage")
        if storage is not None
        else (os.environ.get(ENV_VAR), f"${ENV_VAR}")
        if os.environ.get(ENV_VAR)
        else (config_storage, "the config's storage")
        if config_storage is not None
        else (None, "")
    )
    try:
        resolve_url(url)
    except StorageError as exc:
        raise StorageError(f"{origin}: {exc}") from exc
    return url


def open_store(
    storage: str | None, config_storage: str | None = None, *, create: bool = True
) -> Store:
    """The study database; with ``create=False`` (every command but ``study create`` and
    ``db upgrade``) never a new one: a SQLite file that does not exist is
    :class:`NoDatabaseError`."""
    _quiet_optuna()
    return Store.open(_url(storage, config_storage), create=create)


def need_study(store: Store, name: str) -> StudyRecord:
    rec = store.get_study(name)
    if rec is None:
        raise NotFoundError(f"no study named {name!r}; `autotune study list` shows the studies")
    return rec


@contextmanager
def study_store(storage: str | None, name: str) -> Iterator[Store]:
    """The existing database (never a new one) that should hold the study ``name``."""
    try:
        store = open_store(storage, create=False)
    except NoDatabaseError as exc:
        raise NotFoundError(f"no study named {name!r}: {exc}") from exc
    with store:
        yield store


@db_app.command("upgrade")
def upgrade(storage: StorageOpt = None) -> None:
    """Create or upgrade autotune's tables (Postgres needs this once; SQLite is automatic)."""
    with Store.open(_url(storage), upgrade=True) as store:
        print(f"database {store.url.split('@')[-1]} at revision {store.current_revision()}")
