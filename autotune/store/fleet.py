"""The controllers that share a study, the worker process groups they started and their
claims (docs/faults.md#2-controllers-workers-and-claims); the claims themselves are
:mod:`autotune.store.claim_book`, and the study lock that makes a claim exclusive is
:mod:`autotune.store.lock`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from autotune.store.claim_book import ClaimBook
from autotune.store.lock import Locked, study_lock
from autotune.store.rows import ControllerRow, StudyRow, WorkerRow

if TYPE_CHECKING:
    from autotune.store.db import Store

__all__ = ["ControllerEntry", "Fleet", "Locked", "WorkerEntry"]


@dataclass(frozen=True)
class ControllerEntry:
    id: int
    study_name: str
    host: str
    pid: int
    proc_start: int | None
    boot_id: str | None
    state: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    idle_s: float
    trials_run: int
    note: str | None
    heartbeat_age_s: float  # by the database's clock


@dataclass(frozen=True)
class WorkerEntry:
    id: int
    controller_id: int
    trial_name: str
    host: str
    pgid: int
    proc_start: int | None
    boot_id: str | None
    tmpdir: str | None
    state: str
    started_at: datetime
    stopped_at: datetime | None


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _entry(r: ControllerRow, study_name: str, now: datetime) -> ControllerEntry:
    return ControllerEntry(
        id=r.id,
        study_name=study_name,
        host=r.host,
        pid=r.pid,
        proc_start=r.proc_start,
        boot_id=r.boot_id,
        state=r.state,
        started_at=r.started_at,
        heartbeat_at=r.heartbeat_at,
        stopped_at=r.stopped_at,
        idle_s=float(r.idle_s or 0.0),
        trials_run=int(r.trials_run or 0),
        note=r.note,
        heartbeat_age_s=(now - _aware(r.heartbeat_at)).total_seconds(),
    )


def _worker(r: WorkerRow) -> WorkerEntry:
    return WorkerEntry(
        id=r.id,
        controller_id=r.controller_id,
        trial_name=r.trial_name,
        host=r.host,
        pgid=r.pgid,
        proc_start=r.proc_start,
        boot_id=r.boot_id,
        tmpdir=r.tmpdir,
        state=r.state,
        started_at=r.started_at,
        stopped_at=r.stopped_at,
    )


class Fleet(ClaimBook):
    """Controllers, workers and claims in ``store``'s database; every call is retried
    through an outage like the store's own."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pg = store.engine.dialect.name == "postgresql"

    # -- clock -------------------------------------------------------------------------------

    def _now_value(self) -> Any:
        """``now()`` on the server for PostgreSQL (one clock for every host), this host's
        clock for SQLite (a file: one host)."""
        return func.now() if self._pg else datetime.now(UTC)

    def _db_now(self, s: Session) -> datetime:
        if self._pg:
            return _aware(s.execute(select(func.now())).scalar_one())
        return datetime.now(UTC)

    # -- controllers -------------------------------------------------------------------------

    def register(
        self, study_name: str, *, host: str, pid: int, proc_start: int | None, boot_id: str | None
    ) -> int:
        def add() -> int:
            with self.store._session("registering a controller") as s:
                row = ControllerRow(
                    study_id=self.store.study_row_id(s, study_name),
                    host=host,
                    pid=pid,
                    proc_start=proc_start,
                    boot_id=boot_id,
                    state="running",
                    started_at=datetime.now(UTC),
                    heartbeat_at=self._now_value(),
                    idle_s=0.0,
                    trials_run=0,
                )
                s.add(row)
                s.flush()
                return row.id

        return self.store._retrying("registering a controller", add)

    def _update(self, what: str, controller_id: int, **values: Any) -> None:
        def run() -> None:
            with self.store._session(what) as s:
                s.execute(
                    update(ControllerRow).where(ControllerRow.id == controller_id).values(**values)
                )

        self.store._retrying(what, run)

    def beat(self, controller_id: int) -> None:
        """One controller heartbeat (no retries: the heartbeat thread tries again soon)."""
        with self.store._session("recording a controller heartbeat") as s:
            s.execute(
                update(ControllerRow)
                .where(ControllerRow.id == controller_id)
                .values(heartbeat_at=self._now_value())
            )

    def add_idle(self, controller_id: int, seconds: float) -> None:
        self._update(
            "recording idle time",
            controller_id,
            idle_s=ControllerRow.idle_s + seconds,
            heartbeat_at=self._now_value(),
        )

    def count_trial(self, controller_id: int) -> None:
        self._update("counting a trial", controller_id, trials_run=ControllerRow.trials_run + 1)

    def set_state(self, controller_id: int, state: str, note: str | None = None) -> None:
        values: dict[str, Any] = {"state": state}
        if state != "running":
            values["stopped_at"] = datetime.now(UTC)
        if note is not None:
            values["note"] = note[:2000]
        self._update(f"marking controller {controller_id} {state}", controller_id, **values)

    def controllers(
        self, study_name: str, states: Sequence[str] | None = None
    ) -> list[ControllerEntry]:
        def read() -> list[ControllerEntry]:
            with self.store._session(f"reading the controllers of {study_name!r}") as s:
                now = self._db_now(s)
                q = (
                    select(ControllerRow)
                    .join(StudyRow, StudyRow.id == ControllerRow.study_id)
                    .where(StudyRow.name == study_name)
                    .order_by(ControllerRow.id)
                )
                if states is not None:
                    q = q.where(ControllerRow.state.in_(list(states)))
                return [_entry(r, study_name, now) for r in s.scalars(q).all()]

        return self.store._retrying(f"reading the controllers of {study_name!r}", read)

    def on_host(self, host: str, states: Sequence[str] = ("running",)) -> list[ControllerEntry]:
        """Controllers of every study on ``host`` (a starting controller reaps dead ones)."""

        def read() -> list[ControllerEntry]:
            with self.store._session(f"reading the controllers on {host}") as s:
                now = self._db_now(s)
                q = (
                    select(ControllerRow, StudyRow.name)
                    .join(StudyRow, StudyRow.id == ControllerRow.study_id)
                    .where(ControllerRow.host == host, ControllerRow.state.in_(list(states)))
                    .order_by(ControllerRow.id)
                )
                return [_entry(r, name, now) for r, name in s.execute(q).all()]

        return self.store._retrying(f"reading the controllers on {host}", read)

    # -- workers -----------------------------------------------------------------------------

    def add_worker(
        self,
        controller_id: int,
        *,
        trial_name: str,
        host: str,
        pgid: int,
        proc_start: int | None,
        boot_id: str | None,
        tmpdir: str | None,
    ) -> int:
        def add() -> int:
            with self.store._session("recording a worker") as s:
                row = WorkerRow(
                    controller_id=controller_id,
                    trial_name=trial_name,
                    host=host,
                    pgid=pgid,
                    proc_start=proc_start,
                    boot_id=boot_id,
                    tmpdir=tmpdir,
                    state="running",
                    started_at=datetime.now(UTC),
                )
                s.add(row)
                s.flush()
                return row.id

        return self.store._retrying("recording a worker", add)

    def workers_on(self, host: str) -> list[tuple[WorkerEntry, ControllerEntry]]:
        """Running worker groups on ``host`` (every study) with their controllers."""

        def read() -> list[tuple[WorkerEntry, ControllerEntry]]:
            with self.store._session(f"reading the workers on {host}") as s:
                now = self._db_now(s)
                q = (
                    select(WorkerRow, ControllerRow, StudyRow.name)
                    .join(ControllerRow, ControllerRow.id == WorkerRow.controller_id)
                    .join(StudyRow, StudyRow.id == ControllerRow.study_id)
                    .where(WorkerRow.host == host, WorkerRow.state == "running")
                    .order_by(WorkerRow.id)
                )
                return [(_worker(w), _entry(c, name, now)) for w, c, name in s.execute(q).all()]

        return self.store._retrying(f"reading the workers on {host}", read)

    def worker_gone(self, worker_id: int, state: str = "stopped") -> None:
        def run() -> None:
            with self.store._session("recording a stopped worker") as s:
                s.execute(
                    update(WorkerRow)
                    .where(WorkerRow.id == worker_id)
                    .values(state=state, stopped_at=datetime.now(UTC))
                )

        self.store._retrying("recording a stopped worker", run)

    def workers(
        self,
        study_name: str,
        *,
        controller_id: int | None = None,
        states: Sequence[str] | None = ("running",),
    ) -> list[WorkerEntry]:
        def read() -> list[WorkerEntry]:
            with self.store._session("reading workers") as s:
                q = (
                    select(WorkerRow)
                    .join(ControllerRow, ControllerRow.id == WorkerRow.controller_id)
                    .join(StudyRow, StudyRow.id == ControllerRow.study_id)
                    .where(StudyRow.name == study_name)
                    .order_by(WorkerRow.id)
                )
                if controller_id is not None:
                    q = q.where(WorkerRow.controller_id == controller_id)
                if states is not None:
                    q = q.where(WorkerRow.state.in_(list(states)))
                return [_worker(r) for r in s.scalars(q).all()]

        return self.store._retrying("reading workers", read)

    # -- the study lock (autotune.store.lock) -----------------------------------------------

    def locked(self, study_name: str) -> contextlib.AbstractContextManager[Locked]:
        """Hold the study lock for one short, synchronous section (no awaits inside)."""
        return study_lock(self, study_name)
