"""The store's validation runs (docs/tuning.md#7-validation): a study's plan added at once,
each run claimed by exactly one controller, updated as it runs, read in order."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, update

from autotune.errors import StorageError
from autotune.store.records import RepeatRecord
from autotune.store.resilience import NOT_LANDED
from autotune.store.rows import RepeatRow
from autotune.store.transactions import StoreBase

__all__ = ["RepeatStore"]

_REPEAT_FIELDS = [
    f.name for f in dataclasses.fields(RepeatRecord) if f.name not in ("id", "study_name")
]


class RepeatStore(StoreBase):
    """Validation runs (part of :class:`autotune.store.db.Store`)."""

    def add_repeats(self, recs: Sequence[RepeatRecord]) -> list[int]:
        """Store validation runs (all or nothing; a study's plan is added at once); returns
        their ids. StorageError when one of them (study, repeat, trial) exists already."""
        if not recs:
            return []
        name = recs[0].study_name
        return self._retrying(
            f"adding validation runs to study {name!r}",
            lambda: self._add_repeats(recs),
            landed=lambda: [r.id for r in self.repeats(name) if r.id is not None] or NOT_LANDED,
        )

    def _add_repeats(self, recs: Sequence[RepeatRecord]) -> list[int]:
        name = recs[0].study_name
        duplicate = StorageError(f"study {name!r} already has a validation plan")
        with self._session(f"adding validation runs to study {name!r}", duplicate) as s:
            ids: dict[str, int] = {}
            rows = []
            for rec in recs:
                if rec.study_name not in ids:
                    ids[rec.study_name] = self.study_row_id(s, rec.study_name)
                values = {k: getattr(rec, k) for k in _REPEAT_FIELDS}
                rows.append(RepeatRow(study_id=ids[rec.study_name], **values))
            s.add_all(rows)
            s.flush()
            return [row.id for row in rows]

    def update_repeat(self, repeat_id: int, **fields: Any) -> None:
        """Set some of a validation run's fields (``state``, its results, timestamps)."""
        unknown = sorted(set(fields) - set(_REPEAT_FIELDS))
        if unknown:
            raise TypeError(
                f"update_repeat() got unknown fields {unknown}; it accepts {_REPEAT_FIELDS}"
            )
        self._retrying(
            f"updating validation run id {repeat_id}",
            lambda: self._update_repeat(repeat_id, fields),
        )

    def _update_repeat(self, repeat_id: int, fields: dict[str, Any]) -> None:
        with self._session(f"updating validation run id {repeat_id}") as s:
            row = s.get(RepeatRow, repeat_id)
            if row is None:
                raise StorageError(f"validation run id {repeat_id} does not exist")
            for key, value in fields.items():
                setattr(row, key, value)

    def claim_repeat(self, repeat_id: int) -> bool:
        """Move a PENDING validation run to RUNNING, for exactly one caller however many
        controllers race for it: one conditional UPDATE, atomic on SQLite and PostgreSQL
        alike (docs/tuning.md#7-validation). False when another controller has it."""

        def claim() -> bool:
            with self._session(f"claiming validation run id {repeat_id}") as s:
                done = s.execute(
                    update(RepeatRow)
                    .where(RepeatRow.id == repeat_id, RepeatRow.state == "PENDING")
                    .values(state="RUNNING", started_at=datetime.now(UTC))
                )
                return bool(done.rowcount == 1)  # type: ignore[attr-defined]

        return self._retrying(f"claiming validation run id {repeat_id}", claim)

    def drop_pending_repeats(self, study_name: str) -> int:
        """Remove a study's validation runs still PENDING (the phase stopped early,
        docs/tuning.md#7-validation); runs claimed or done stay. Returns how many went."""

        def drop() -> int:
            with self._session(f"dropping the pending runs of study {study_name!r}") as s:
                study_id = self.study_row_id(s, study_name)
                done = s.execute(
                    delete(RepeatRow).where(
                        RepeatRow.study_id == study_id, RepeatRow.state == "PENDING"
                    )
                )
                return int(done.rowcount)  # type: ignore[attr-defined]

        return self._retrying(f"dropping the pending runs of study {study_name!r}", drop)

    def repeats(self, study_name: str) -> list[RepeatRecord]:
        """A study's validation runs in the order they are run (repeat, then position)."""
        with self._session(f"reading the validation runs of study {study_name!r}") as s:
            study_id = self.study_row_id(s, study_name)
            rows = s.scalars(
                select(RepeatRow)
                .where(RepeatRow.study_id == study_id)
                .order_by(RepeatRow.repeat_index, RepeatRow.position)
            ).all()
            return [
                RepeatRecord(
                    id=row.id,
                    study_name=study_name,
                    **{k: getattr(row, k) for k in _REPEAT_FIELDS},
                )
                for row in rows
            ]
