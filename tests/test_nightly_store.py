"""Revision 0006's records and the held locks, on SQLite and PostgreSQL: decisions and
schedules round-trip, and a held lock refuses a second taker (another connection) until
released."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.databases import BACKENDS, fresh_database

from autotune.errors import BusyError, NotFoundError, StorageError
from autotune.nightly.job_lock import held_lock
from autotune.nightly.job_records import (
    DecisionRecord,
    ScheduleRecord,
    add_decision,
    add_schedule,
    decisions,
    get_schedule,
    remove_schedule,
    update_schedule,
)
from autotune.store import Store

T = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as fresh:
        Store.open(fresh, upgrade=True).close()
        yield fresh


def test_decisions_and_schedules_round_trip(url: str) -> None:
    args = {"max_model_len": 4096, "gpu_memory_utilization": 0.9}
    with Store.open(url) as store:
        rec = DecisionRecord(
            deployment="chat",
            created_at=T,
            decision="promote",
            reason="incumbent infeasible",
            incumbent=args,
            deployed={**args, "max_model_len": 8192},
            exit_code=3,
            gain_pct=float("nan"),  # stored as NULL, as every float column here
            gain_low=-5.0,
            drift={"drifted": True, "reasons": ["prompt_p50 700 -> 1400 (+100.0 %)"]},
            projection=[{"label": "warm", "changed": ["max_model_len"]}],
        )
        add_decision(store, rec)
        add_decision(store, DecisionRecord("other", T, "keep", "", args, args, 0))
        (got,) = decisions(store, "chat")
        assert got.id == rec.id and got.created_at == T and got.gain_pct is None
        assert got.deployed["max_model_len"] == 8192 and got.drift == rec.drift
        add_schedule(store, ScheduleRecord("n", "0 2 * * *", "/x.yaml", T))
        with pytest.raises(StorageError, match="already exists"):
            add_schedule(store, ScheduleRecord("n", "0 3 * * *", "/y.yaml", T))
        update_schedule(store, "n", last_fire_at=T, last_exit_code=0)
        s = get_schedule(store, "n")
        assert s is not None and s.last_fire_at == T and s.timezone == "UTC"
        remove_schedule(store, "n")
        with pytest.raises(NotFoundError):
            remove_schedule(store, "n")


def test_a_held_lock_refuses_a_second_taker(url: str) -> None:
    with Store.open(url) as a, Store.open(url) as b:
        with held_lock(a, "nightly:chat", "busy chat"):
            with (
                pytest.raises(BusyError, match="busy chat"),
                held_lock(b, "nightly:chat", "busy chat"),
            ):
                pass
            with held_lock(b, "nightly:other", "x"):  # another deployment is independent
                pass
        with held_lock(b, "nightly:chat", "busy chat"):  # released
            pass
