"""autotune.store: schema set-up, migrations, connection errors, and sharing one database
with Optuna's RDB storage (in both orders, on both backends). Every test gets an empty
database; the helpers come from ``test_store.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from support.databases import BACKENDS, OUR_TABLES, fresh_database, make_study, make_trial

from autotune.errors import ServiceError, StorageError
from autotune.store import VERSION_TABLE, Store
from autotune.store.migrate import alembic_config, head_revision, include_object
from autotune.store.rows import Base

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as fresh:
        yield fresh


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    with fresh_database("sqlite", tmp_path) as fresh:
        yield fresh


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with fresh_database("postgres", tmp_path) as fresh:
        yield fresh


def inspect_db(url: str) -> tuple[set[str], str | None, list[object]]:
    """(table names, Optuna's alembic_version, autogenerate's diff of our models)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
            optuna_rev = (
                MigrationContext.configure(conn).get_current_revision()
                if "alembic_version" in tables
                else None
            )
            ctx = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "include_object": include_object}
            )
            diff = compare_metadata(ctx, Base.metadata)
        return tables, optuna_rev, diff
    finally:
        engine.dispose()


def optuna_study(url: str, name: str, n_trials: int = 2) -> int:
    """Create (or extend) an Optuna study in ``url``; returns its trial count."""
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n_trials)
        return len(study.trials)
    finally:
        storage.remove_session()
        storage.engine.dispose()


@pytest.mark.parametrize("optuna_first", [True, False], ids=["optuna-first", "ours-first"])
def test_shares_a_database_with_optuna(url: str, optuna_first: bool) -> None:
    if optuna_first:
        optuna_study(url, "o")
        optuna_rev = inspect_db(url)[1]
        assert optuna_rev is not None
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        store.add_trial(make_trial("s", 0))
    n_optuna = optuna_study(url, "o")  # Optuna still works, in either order
    assert n_optuna == (4 if optuna_first else 2)
    tables, optuna_rev_after, diff = inspect_db(url)
    assert tables >= OUR_TABLES
    optuna_tables = tables - OUR_TABLES
    assert {"studies", "trials", "alembic_version"} <= optuna_tables
    assert not any(t.startswith("autotune_") for t in optuna_tables)
    assert optuna_rev_after is not None and optuna_rev_after != head_revision()
    if optuna_first:
        assert optuna_rev_after == optuna_rev  # our upgrade left Optuna's version alone
    assert diff == []  # models == migrations, and Optuna's tables are not ours to drop
    with Store.open(url) as store:
        assert store.current_revision() == head_revision()
        assert len(store.trials("s")) == 1


def test_downgrade_removes_only_our_tables(url: str) -> None:
    optuna_study(url, "o", n_trials=1)
    Store.open(url, upgrade=True).close()
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "base")
    finally:
        engine.dispose()
    tables, optuna_rev, _ = inspect_db(url)
    assert tables & OUR_TABLES == {VERSION_TABLE}
    assert optuna_rev is not None
    assert optuna_study(url, "o", n_trials=1) == 2


def test_delete_study_removes_optuna_study(url: str) -> None:
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))  # its Optuna study is "optuna-s"
        store.create_study(make_study("keep"))
        optuna_study(url, "optuna-s")
        optuna_study(url, "optuna-keep")
        store.delete_study("s")
        assert store.get_study("s") is None
        assert optuna.get_all_study_names(store.optuna_storage()) == ["optuna-keep"]
        store.delete_study("keep")
        store.create_study(make_study("later"))
        store.delete_study("later")  # no Optuna study was ever made for it
        assert optuna.get_all_study_names(store.optuna_storage()) == []


def test_delete_study_does_not_create_optuna_tables(url: str) -> None:
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        store.delete_study("s")
    assert inspect_db(url)[0] == OUR_TABLES


def test_sqlite_fresh_file_is_upgraded(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        assert store.current_revision() == head_revision()
        assert store.list_studies() == []
    assert inspect_db(sqlite_url)[0] == OUR_TABLES


def test_sqlite_upgrade_false_only_checks(sqlite_url: str) -> None:
    with pytest.raises(StorageError, match="is not initialised; run `autotune db upgrade"):
        Store.open(sqlite_url, upgrade=False)


@pytest.mark.postgres
def test_postgres_needs_explicit_upgrade(pg_url: str) -> None:
    with pytest.raises(StorageError) as info:
        Store.open(pg_url)
    masked = sa.engine.make_url(pg_url).render_as_string(hide_password=True)
    assert str(info.value) == (
        f"database at {masked} is not initialised; run `autotune db upgrade --storage {masked}`"
    )
    assert inspect_db(pg_url)[0] == set()  # the check wrote nothing
    Store.open(pg_url, upgrade=True).close()
    with Store.open(pg_url) as store:
        assert store.current_revision() == head_revision()


def test_database_from_a_newer_autotune_is_refused(url: str) -> None:
    Store.open(url, upgrade=True).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff'"))
    engine.dispose()
    with pytest.raises(StorageError, match="revision ffff, which this autotune does not know"):
        Store.open(url, upgrade=True)
    store = Store(url, sa.create_engine(url))  # `autotune db upgrade` on an open store
    with pytest.raises(StorageError, match="written by a newer autotune"):
        store.upgrade()
    store.close()


@pytest.mark.parametrize(
    "bad",
    [
        "postgresql+psycopg://user:s3cret@127.0.0.1:1/autotune",
        "postgresql://user:s3cret@127.0.0.1:1/autotune",
    ],
)
def test_unreachable_server_is_one_line(bad: str) -> None:
    with pytest.raises(ServiceError) as info:
        Store.open(bad)
    message = str(info.value)
    assert "\n" not in message and "s3cret" not in message
    assert message.startswith(
        "cannot connect to the study database at "
        "postgresql+psycopg://user:***@127.0.0.1:1/autotune: "
    )
    assert "check that the server is running" in message
    assert isinstance(info.value.__cause__, sa.exc.OperationalError)


def test_unopenable_sqlite_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as info:
        Store.open(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("cannot open the study database at sqlite:///")
    assert info.value.__cause__ is not None


def test_unknown_driver_is_a_storage_error() -> None:
    with pytest.raises(StorageError, match="cannot use the study database URL nosuch://h/db"):
        Store.open("nosuch://h/db")
