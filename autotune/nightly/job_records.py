"""The nightly decisions and the scheduler's schedules in the study database (revision
0006): plain records in, plain records out, one transaction per call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update

from autotune.errors import NotFoundError, StorageError
from autotune.store import Store
from autotune.store.rows import NightlyDecisionRow, ScheduleRow

__all__ = [
    "DecisionRecord",
    "ScheduleRecord",
    "add_decision",
    "add_schedule",
    "decisions",
    "get_schedule",
    "remove_schedule",
    "schedules",
    "update_schedule",
]


@dataclass
class DecisionRecord:
    deployment: str
    created_at: datetime
    decision: str  # keep | promote | none-feasible | too-noisy | rollback
    reason: str
    incumbent: dict[str, Any]
    deployed: dict[str, Any]
    exit_code: int
    study_name: str | None = None
    challenger: dict[str, Any] | None = None
    gain_pct: float | None = None
    gain_low: float | None = None
    gain_high: float | None = None
    confidence: float | None = None
    drift: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    projection: list[Any] | None = None
    command: str | None = None
    model: str | None = None
    output_path: str | None = None
    dry_run: bool = False
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["created_at"] = self.created_at.isoformat()
        return d


_DECISION_FIELDS = [f.name for f in dataclasses.fields(DecisionRecord) if f.name != "id"]


@dataclass
class ScheduleRecord:
    name: str
    cron: str
    config_path: str
    created_at: datetime
    timezone: str = "UTC"
    last_fire_at: datetime | None = None
    last_started_at: datetime | None = None
    last_exit_code: int | None = None
    id: int | None = field(default=None)


_SCHEDULE_FIELDS = [f.name for f in dataclasses.fields(ScheduleRecord) if f.name != "id"]


def add_decision(store: Store, rec: DecisionRecord) -> int:
    with store._session(f"recording the decision for {rec.deployment!r}") as s:
        row = NightlyDecisionRow(**{k: getattr(rec, k) for k in _DECISION_FIELDS})
        s.add(row)
        s.flush()
        rec.id = row.id
        return row.id


def decisions(store: Store, deployment: str) -> list[DecisionRecord]:
    """A deployment's decisions, oldest first."""
    with store._session(f"reading the decisions of {deployment!r}") as s:
        rows = s.scalars(
            select(NightlyDecisionRow)
            .where(NightlyDecisionRow.deployment == deployment)
            .order_by(NightlyDecisionRow.id)
        ).all()
        return [
            DecisionRecord(id=r.id, **{k: getattr(r, k) for k in _DECISION_FIELDS}) for r in rows
        ]


def add_schedule(store: Store, rec: ScheduleRecord) -> int:
    exists = StorageError(f"schedule {rec.name!r} already exists; remove it first")
    with store._session(f"adding schedule {rec.name!r}", on_conflict=exists) as s:
        if s.scalar(select(ScheduleRow.id).where(ScheduleRow.name == rec.name)) is not None:
            raise exists
        row = ScheduleRow(**{k: getattr(rec, k) for k in _SCHEDULE_FIELDS})
        s.add(row)
        s.flush()
        rec.id = row.id
        return row.id


def _schedule(row: ScheduleRow) -> ScheduleRecord:
    return ScheduleRecord(id=row.id, **{k: getattr(row, k) for k in _SCHEDULE_FIELDS})


def schedules(store: Store) -> list[ScheduleRecord]:
    with store._session("reading schedules") as s:
        return [_schedule(r) for r in s.scalars(select(ScheduleRow).order_by(ScheduleRow.name))]


def get_schedule(store: Store, name: str) -> ScheduleRecord | None:
    with store._session(f"reading schedule {name!r}") as s:
        row = s.scalar(select(ScheduleRow).where(ScheduleRow.name == name))
        return _schedule(row) if row is not None else None


def remove_schedule(store: Store, name: str) -> None:
    with store._session(f"removing schedule {name!r}") as s:
        n = s.execute(delete(ScheduleRow).where(ScheduleRow.name == name)).rowcount  # type: ignore[attr-defined]
        if not n:
            raise NotFoundError(f"no schedule named {name!r} (see `autotune schedule list`)")


def update_schedule(store: Store, name: str, **values: Any) -> None:
    with store._session(f"updating schedule {name!r}") as s:
        s.execute(update(ScheduleRow).where(ScheduleRow.name == name).values(**values))
