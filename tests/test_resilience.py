"""Riding out database outages (docs/faults.md#4-database-outages): which errors are
transient, bounded retries up to the tolerance, the landed check before a non-idempotent
write is retried, one line naming the database when the outage lasts too long."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError
from support.databases import make_study, make_trial

from autotune.errors import DatabaseLostError
from autotune.store import Store
from autotune.store.resilience import NOT_LANDED, Resilience, is_transient

URL = "postgresql+psycopg://autotune:secret@db.example:5432/autotune"


def dropped() -> OperationalError:
    """What SQLAlchemy raises when the server closed the connection."""
    return OperationalError(
        "SELECT 1", {}, psycopg.OperationalError("server closed the connection")
    )


class Flaky:
    """Fails ``n`` times with a dropped connection, then returns ``value``; ``lands`` says
    whether a failed attempt's write went through anyway."""

    def __init__(self, n: int, value: int = 7) -> None:
        self.n, self.value, self.calls = n, value, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.n:
            raise dropped()
        return self.value


def test_transient_errors_are_the_ones_that_mean_unreachable() -> None:
    assert is_transient(dropped())
    wrapped = RuntimeError("Optuna's commit failed")
    wrapped.__cause__ = dropped()
    assert is_transient(wrapped)  # Optuna's StorageInternalError wraps the driver's error
    assert not is_transient(IntegrityError("INSERT", {}, Exception("duplicate key")))
    # SQLite refuses a writer that would deadlock at once: the transaction is retried
    assert is_transient(
        OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    )
    assert not is_transient(
        OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x"))
    )
    assert not is_transient(ValueError("bad value"))
    lost = DatabaseLostError("gave up")
    lost.__cause__ = dropped()
    assert not is_transient(lost)  # given up once: never retried again by an outer call


def test_a_short_outage_is_retried_and_counted() -> None:
    r = Resilience(URL, tolerance_s=5)
    fn = Flaky(3)
    assert r.call("reading", fn) == 7
    assert fn.calls == 4 and r.outages == 1 and 0 < r.longest_outage_s < 5


def test_without_a_tolerance_the_error_is_raised_unchanged() -> None:
    r = Resilience(URL, tolerance_s=0)
    with pytest.raises(OperationalError):
        r.call("reading", Flaky(1))


def test_an_outage_longer_than_the_tolerance_is_one_line_naming_the_database() -> None:
    r = Resilience(URL, tolerance_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(DatabaseLostError) as info:
        r.call("adding trial 3 of study 'x'", Flaky(10**6))
    assert 0.5 <= time.monotonic() - t0 < 3
    msg = str(info.value)
    assert "\n" not in msg and "secret" not in msg
    assert msg.startswith("lost the study database at postgresql+psycopg://autotune:***@db.example")
    assert "outage tolerance (0.5 s, controller.db_outage_tolerance_s)" in msg
    assert "while adding trial 3 of study 'x': server closed the connection" in msg
    # given up: the next call fails at once instead of waiting the tolerance again
    t0 = time.monotonic()
    with pytest.raises(DatabaseLostError):
        r.call("reading", Flaky(1))
    assert time.monotonic() - t0 < 0.3
    assert r.call("reading", Flaky(0)) == 7  # back: retries work again


def test_a_write_that_landed_is_not_repeated() -> None:
    r = Resilience(URL, tolerance_s=5)
    writes: list[int] = []

    def write() -> int:
        writes.append(1)
        raise dropped()  # the commit went through, the answer was lost

    assert r.call("adding", write, landed=lambda: 41) == 41
    assert writes == [1]
    fn = Flaky(1)
    assert r.call("adding", fn, landed=lambda: NOT_LANDED) == 7 and fn.calls == 2


def test_store_writes_check_they_landed_before_retrying(tmp_path: Path) -> None:
    """add_trial whose first attempt committed but reported a dropped connection: the retry
    finds the stored trial instead of failing on the duplicate."""
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        store.create_study(make_study("s"))
        store.set_outage_tolerance(5)
        real = store._add_trial
        attempts: list[int] = []

        def commit_then_drop(rec: object) -> int:
            attempts.append(real(rec))  # type: ignore[arg-type]
            raise dropped()

        store._add_trial = commit_then_drop  # type: ignore[method-assign]
        trial_id = store.add_trial(make_trial("s", 0))
        assert attempts == [trial_id]
        assert [t.optuna_trial_number for t in store.trials("s")] == [0]
