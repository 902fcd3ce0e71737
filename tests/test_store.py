"""autotune.store: the contract every backend (SQLite file, PostgreSQL) must meet.

Each backend gets one fresh, upgraded database per module; tests use their own study names.
PostgreSQL tests connect to ``$AUTOTUNE_TEST_PG_URL`` (default: database ``test`` on
127.0.0.1:5432 as ``postgres``) only to create and drop ``autotune_test_<random>`` databases;
with CI=true a missing server fails them instead of skipping. Schema, migration and Optuna
coexistence tests are in ``test_store_schema.py``; both use tests/support/databases.py.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from support.databases import (
    BACKENDS,
    OUR_TABLES,
    fresh_database,
    make_level,
    make_study,
    make_trial,
)

from autotune.errors import NotFoundError, StorageError
from autotune.store import (
    DEFAULT_URL,
    Store,
    resolve_url,
)


def counts(url: str) -> dict[str, int]:
    """Rows per autotune table, read behind the store's back."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in sorted(OUR_TABLES - {"autotune_alembic_version"})
            }
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=BACKENDS)
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    with fresh_database(request.param, tmp_path_factory.mktemp("store")) as url:
        s = Store.open(url, upgrade=True)
        yield s
        s.close()


@pytest.fixture
def name() -> str:
    """A study name no other test in the module uses."""
    return f"study-{secrets.token_hex(4)}"


def test_create_get_list_delete(store: Store, name: str) -> None:
    rec = make_study(name)
    study_id = store.create_study(rec)
    got = store.get_study(name)
    assert got is not None and got.created_at is not None
    assert got.created_at.tzinfo is not None
    assert got == replace(rec, id=study_id, created_at=got.created_at)
    summary = next(s for s in store.list_studies() if s.name == name)
    assert (summary.mode, summary.worker_kind, summary.n_trials, summary.best_objective) == (
        "slo-capacity",
        "sim-virtual",
        0,
        None,
    )
    store.delete_study(name)
    assert store.get_study(name) is None
    assert name not in {s.name for s in store.list_studies()}
    with pytest.raises(NotFoundError, match=f"study '{name}' does not exist"):
        store.delete_study(name)


def test_duplicate_study_name(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    with pytest.raises(
        StorageError,
        match=rf"study '{name}' already exists; use "
        rf"`autotune study run {name}` or delete it",
    ):
        store.create_study(replace(make_study(name), mode="offline"))
    got = store.get_study(name)
    assert got is not None and got.mode == "slo-capacity"


def test_trial_round_trip(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    levels = [make_level(2), make_level(0), make_level(1)]  # stored in any order, read sorted
    rec = make_trial(name, 0, levels=levels)
    trial_id = store.add_trial(rec)
    [got] = store.trials(name)
    assert [lv.level_index for lv in got.levels] == [0, 1, 2]
    assert all(lv.id is not None for lv in got.levels)
    expected = replace(
        rec, id=trial_id, levels=[replace(make_level(i), id=got.levels[i].id) for i in range(3)]
    )
    assert got == expected  # datetimes compare as instants: stored UTC, read back aware
    assert got.started_at is not None and got.started_at.tzinfo is not None


def test_trials_are_ordered_by_number(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    for number in (2, 0, 1):
        store.add_trial(make_trial(name, number, levels=[], started_at=None))
    got = store.trials(name)
    assert [t.optuna_trial_number for t in got] == [0, 1, 2]
    assert all(t.started_at is not None for t in got)  # the store stamps a missing start


def test_update_trial_and_summary(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    ids = [store.add_trial(make_trial(name, n, levels=[])) for n in range(4)]
    done = datetime.now(UTC)
    store.update_trial(
        ids[0],
        state="COMPLETE",
        objective=2.5,
        constraints=[-0.5],
        feasible=True,
        capacity_scale=1.5,
        finished_at=done,
    )
    store.update_trial(ids[1], state="COMPLETE", objective=9.0, feasible=False)  # not best
    store.update_trial(ids[2], state="FAIL", failure_class="KV_TOO_SMALL", log_tail="x\ny")
    got = store.trials(name)
    assert (got[0].state, got[0].objective, got[0].constraints, got[0].feasible) == (
        "COMPLETE",
        2.5,
        [-0.5],
        True,
    )
    assert got[0].finished_at == done
    assert (got[2].state, got[2].failure_class, got[2].log_tail) == ("FAIL", "KV_TOO_SMALL", "x\ny")
    assert got[3] == replace(make_trial(name, 3, levels=[]), id=ids[3])
    summary = next(s for s in store.list_studies() if s.name == name)
    assert (summary.n_trials, summary.n_complete, summary.best_objective) == (4, 2, 2.5)


def test_update_trial_rejects_bad_input(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    trial_id = store.add_trial(make_trial(name, 0, levels=[]))
    with pytest.raises(TypeError, match="unknown or read-only fields"):
        store.update_trial(trial_id, stat="COMPLETE")
    with pytest.raises(StorageError, match="trial id 999999 does not exist"):
        store.update_trial(999_999, state="FAIL")
    with pytest.raises(StorageError, match="no timezone"):
        store.update_trial(trial_id, state="COMPLETE", finished_at=datetime(2026, 1, 1))
    assert store.trials(name)[0].state == "RUNNING"  # the failed update changed nothing


def test_add_level(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    trial_id = store.add_trial(make_trial(name, 0, levels=[make_level(0)]))
    level_id = store.add_level(trial_id, make_level(1))
    assert store.trials(name)[0].levels[1] == replace(make_level(1), id=level_id)
    with pytest.raises(StorageError, match="already has level 1"):
        store.add_level(trial_id, make_level(1, scale=9.0))
    with pytest.raises(StorageError, match="trial id 999999 does not exist"):
        store.add_level(999_999, make_level(0))
    assert len(store.trials(name)[0].levels) == 2


def test_failed_writes_leave_database_unchanged(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    store.add_trial(make_trial(name, 0))
    before = counts(store.url)
    with pytest.raises(NotFoundError, match="study 'no-such-study' does not exist"):
        store.add_trial(make_trial("no-such-study", 0))
    with pytest.raises(StorageError, match=f"trial 0 of study '{name}' already exists"):
        store.add_trial(make_trial(name, 0))
    # The trial row and its first level insert fine; the clashing second level must take
    # them back out with it.
    with pytest.raises(StorageError, match="trial 1 of study"):
        store.add_trial(make_trial(name, 1, levels=[make_level(0), make_level(0)]))
    with pytest.raises(StorageError, match="achieved_rate"):  # NOT NULL: NaN means no value
        store.add_trial(make_trial(name, 2, levels=[make_level(0, achieved_rate=math.nan)]))
    assert counts(store.url) == before
    assert [t.optuna_trial_number for t in store.trials(name)] == [0]


def test_non_finite_floats_read_back_as_none(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    metrics = {"mean_ttft_ms": math.nan, "rates": [math.inf, 1.0, -math.inf], "ok": (1, 2)}
    store.add_trial(
        make_trial(
            name,
            0,
            objective=math.nan,
            capacity_scale=math.inf,
            levels=[make_level(0, goodput=math.nan, metrics=metrics)],
        )
    )
    [got] = store.trials(name)
    assert (got.objective, got.capacity_scale) == (None, math.inf)
    assert got.levels[0].goodput is None
    assert got.levels[0].metrics == {"mean_ttft_ms": None, "rates": [None, 1.0, None], "ok": [1, 2]}


def test_delete_cascades_to_trials_and_levels(store: Store, name: str) -> None:
    store.create_study(make_study(name))
    store.add_trial(make_trial(name, 0))
    before = counts(store.url)
    store.delete_study(name)
    after = counts(store.url)
    assert before["autotune_studies"] - after["autotune_studies"] == 1
    assert before["autotune_trials"] - after["autotune_trials"] == 1
    assert before["autotune_levels"] - after["autotune_levels"] == 3
    with pytest.raises(NotFoundError, match=f"study '{name}' does not exist"):
        store.trials(name)


def test_resolve_url_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_DATABASE_URL", raising=False)
    assert resolve_url(None) == DEFAULT_URL == "sqlite:///autotune.db"
    monkeypatch.setenv("AUTOTUNE_DATABASE_URL", "sqlite:///from-env.db")
    assert resolve_url(None) == "sqlite:///from-env.db"
    assert resolve_url("sqlite:///explicit.db") == "sqlite:///explicit.db"
    # psycopg 3 is the driver autotune ships; a bare postgresql:// would ask for psycopg2.
    assert resolve_url("postgresql://u:p%40ss@h:5/db") == "postgresql+psycopg://u:p%40ss@h:5/db"
    monkeypatch.setenv("AUTOTUNE_DATABASE_URL", "postgres://h/db")
    assert resolve_url(None) == "postgresql+psycopg://h/db"
    with pytest.raises(StorageError, match="not a database URL"):
        resolve_url("not a url")
