"""Claims on units of work that are no Optuna trial (a validation run of the best config,
say): exactly one controller gets each key, however many race
(docs/faults.md#2-controllers-workers-and-claims). Part of :class:`autotune.store.fleet.Fleet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from autotune.errors import StorageError
from autotune.store.resilience import NOT_LANDED, NotLanded
from autotune.store.rows import ClaimRow, StudyRow

if TYPE_CHECKING:
    from autotune.store.db import Store

__all__ = ["ClaimBook", "ClaimEntry"]


@dataclass(frozen=True)
class ClaimEntry:
    key: str
    trial_number: int | None
    stage: str | None
    controller_id: int | None
    lane: int
    claimed_at: datetime
    released_at: datetime | None
    outcome: str | None


class ClaimBook:
    """A study's claims in ``store``'s database; every call is retried through an outage."""

    store: Store

    def _claims(self, s: Session, study_name: str) -> list[ClaimEntry]:
        q = (
            select(ClaimRow)
            .join(StudyRow, StudyRow.id == ClaimRow.study_id)
            .where(StudyRow.name == study_name)
            .order_by(ClaimRow.id)
        )
        return [
            ClaimEntry(
                key=r.key,
                trial_number=r.trial_number,
                stage=r.stage,
                controller_id=r.controller_id,
                lane=int(r.lane or 0),
                claimed_at=r.claimed_at,
                released_at=r.released_at,
                outcome=r.outcome,
            )
            for r in s.scalars(q).all()
        ]

    def claims(self, study_name: str) -> list[ClaimEntry]:
        def read() -> list[ClaimEntry]:
            with self.store._session("reading claims") as s:
                return self._claims(s, study_name)

        return self.store._retrying("reading claims", read)

    def claim_once(
        self,
        study_name: str,
        key: str,
        *,
        controller_id: int | None,
        stage: str | None = None,
        lane: int = 0,
    ) -> bool:
        """Claim a unit of work that is no Optuna trial (a validation run of the best
        config, say) by its ``key``: True for exactly one caller, however many race (the
        key is unique per study), False for every other."""
        taken = StorageError(f"{key} is already claimed")

        def add() -> bool:
            try:
                with self.store._session(f"claiming {key}", on_conflict=taken) as s:
                    s.add(
                        ClaimRow(
                            study_id=self.store.study_row_id(s, study_name),
                            key=key,
                            stage=stage,
                            controller_id=controller_id,
                            lane=lane,
                            claimed_at=datetime.now(UTC),
                        )
                    )
                    s.flush()
            except StorageError as exc:
                if exc is taken:
                    return False
                raise
            return True

        return self.store._retrying(
            f"claiming {key}", add, landed=lambda: self._claimed_by(study_name, key, controller_id)
        )

    def _claimed_by(self, study_name: str, key: str, controller_id: int | None) -> bool | NotLanded:
        with self.store._session(f"reading claim {key}") as s:
            mine = [c for c in self._claims(s, study_name) if c.key == key]
        if not mine:
            return NOT_LANDED
        return mine[0].controller_id == controller_id

    def release(self, study_name: str, key: str, outcome: str) -> None:
        """Close a claim with its outcome (COMPLETE, FAIL or ABANDONED); idempotent."""

        def run() -> None:
            with self.store._session(f"releasing {key}") as s:
                study_id = self.store.study_row_id(s, study_name)
                s.execute(
                    update(ClaimRow)
                    .where(ClaimRow.study_id == study_id, ClaimRow.key == key)
                    .values(outcome=outcome, released_at=datetime.now(UTC))
                )

        self.store._retrying(f"releasing {key}", run)
