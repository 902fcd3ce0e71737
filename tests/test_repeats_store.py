"""The validation runs' table (``autotune_repeats``, revision 0004) on SQLite and PostgreSQL:
records round-trip, the plan is all or nothing, updates are checked, a study's deletion takes
its runs along, and the revision upgrades a database at 0002 without touching its rows."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from support.databases import BACKENDS, fresh_database, make_study, make_trial

from autotune.errors import NotFoundError, StorageError
from autotune.store import RepeatRecord, Store
from autotune.store.migrate import alembic_config, head_revision


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as fresh:
        yield fresh


def run(study: str, repeat: int, position: int, trial: int, **over: Any) -> RepeatRecord:
    rec = RepeatRecord(
        study_name=study,
        repeat_index=repeat,
        position=position,
        trial_number=trial,
        role="baseline" if trial == 0 else "candidate",
        engine_args={"max_num_seqs": 64 + trial, "max_model_len": 4096},
        sample=f"workload seed {1000 + repeat}",
        workload_seed=2**40 + repeat,  # BigInteger: SeedSequence states exceed 2**31
        jitter_seed=2**33 + repeat,
    )
    return replace(rec, **over)


def test_repeats_round_trip(url: str) -> None:
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        plan = [run("s", r, p, (p + r) % 3) for r in range(2) for p in range(3)]
        ids = store.add_repeats(list(reversed(plan)))  # read back in (repeat, position) order
        assert len(set(ids)) == 6
        got = store.repeats("s")
        assert [(g.repeat_index, g.position) for g in got] == [
            (r, p) for r in range(2) for p in range(3)
        ]
        assert [replace(g, id=None) for g in got] == plan
        started = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=-5)))
        store.update_repeat(
            got[1].id,  # type: ignore[arg-type]
            state="COMPLETE",
            slo_held=True,
            capacity_scale=1.8844,
            objective=1642.5,
            worst_margin=math.nan,  # no value: reads back as None on both backends
            p99_ttft_ms=812.0,
            overlength_rate=0.0075,
            requests=400,
            levels=11,
            violations=["over-length 1.2 % > 1 %"],
            started_at=started,
            finished_at=datetime.now(UTC),
        )
        done = store.repeats("s")[1]
        assert (done.state, done.slo_held, done.capacity_scale, done.objective) == (
            "COMPLETE",
            True,
            1.8844,
            1642.5,
        )
        assert (done.worst_margin, done.p99_ttft_ms, done.p99_tpot_ms) == (None, 812.0, None)
        assert (done.overlength_rate, done.requests, done.levels) == (0.0075, 400, 11)
        assert done.violations == ["over-length 1.2 % > 1 %"]
        assert done.started_at == started and done.started_at.tzinfo is not None
        assert (done.workload_seed, done.engine_args) == (2**40, plan[1].engine_args)
        assert store.repeats("s")[0].state == "PENDING"  # the others untouched


def test_a_plan_is_all_or_nothing_and_updates_are_checked(url: str) -> None:
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        store.add_repeats([run("s", 0, 0, 0), run("s", 0, 1, 1)])
        # a second plan clashing in one run adds none of its runs
        with pytest.raises(StorageError, match="study 's' already has a validation plan"):
            store.add_repeats([run("s", 1, 0, 0), run("s", 0, 1, 1)])
        assert len(store.repeats("s")) == 2
        with pytest.raises(NotFoundError, match="study 'nope' does not exist"):
            store.add_repeats([run("nope", 0, 0, 0)])
        with pytest.raises(TypeError, match="unknown fields"):
            store.update_repeat(store.repeats("s")[0].id or 0, stat="COMPLETE")
        with pytest.raises(StorageError, match="validation run id 999999 does not exist"):
            store.update_repeat(999_999, state="COMPLETE")
        assert store.add_repeats([]) == []


def test_dropping_pending_runs_keeps_claimed_and_done_ones(url: str) -> None:
    # the validation phase's early stop (docs/tuning.md#7-validation, "Stopping early")
    with Store.open(url, upgrade=True) as store:
        for name in ("s", "other"):
            store.create_study(make_study(name))
            store.add_repeats([run(name, r, p, p) for r in range(3) for p in range(2)])
        got = store.repeats("s")
        store.update_repeat(got[0].id, state="COMPLETE")  # type: ignore[arg-type]
        assert store.claim_repeat(got[1].id)  # type: ignore[arg-type]
        assert store.drop_pending_repeats("s") == 4
        assert [(r.repeat_index, r.position, r.state) for r in store.repeats("s")] == [
            (0, 0, "COMPLETE"),
            (0, 1, "RUNNING"),
        ]
        assert store.drop_pending_repeats("s") == 0
        assert len(store.repeats("other")) == 6  # another study's plan is untouched
        with pytest.raises(NotFoundError):
            store.drop_pending_repeats("missing")


def test_deleting_a_study_deletes_its_runs(url: str) -> None:
    with Store.open(url, upgrade=True) as store:
        for name in ("gone", "kept"):
            store.create_study(make_study(name))
            store.add_repeats([run(name, 0, 0, 0)])
        store.delete_study("gone")
        assert len(store.repeats("kept")) == 1
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            n = conn.execute(sa.text("SELECT count(*) FROM autotune_repeats")).scalar_one()
    finally:
        engine.dispose()
    assert n == 1


def test_revision_0004_upgrades_a_database_at_0002(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0002")
        with Store.open(url, upgrade=True) as store:  # 0002 -> head
            assert store.current_revision() == head_revision()
        with engine.begin() as conn:  # and back: the old tables and their rows stay
            command.downgrade(alembic_config(conn), "0002")
            assert not sa.inspect(conn).has_table("autotune_repeats")
    finally:
        engine.dispose()
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        store.add_trial(make_trial("s", 0))
        store.add_repeats([run("s", 0, 0, 0)])
        assert len(store.trials("s")) == 1 and len(store.repeats("s")) == 1
