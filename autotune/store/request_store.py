"""The store's per-request records (revision 0009, docs/loadgen.md#6-per-request-records): one
row per stored level that kept them, its requests-jsonl text gzip-compressed in a binary
column (``bytea`` on PostgreSQL, a BLOB on SQLite), so both backends keep them inside the
database, and deleting a study, a trial or a level deletes them with it.

They live in a table of their own, not in ``autotune_levels``: reading a study's trials (every
command does) never loads them; only an export of one level does.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Integer, LargeBinary, select
from sqlalchemy.orm import Mapped, mapped_column

from autotune.errors import StorageError
from autotune.store.records import RequestLog
from autotune.store.resilience import NOT_LANDED, NotLanded
from autotune.store.rows import Base, LevelRow
from autotune.store.transactions import StoreBase

__all__ = ["LevelRequestsRow", "RequestStore"]


class LevelRequestsRow(Base):
    """A level's per-request records (:class:`~autotune.store.records.RequestLog`)."""

    __tablename__ = "autotune_level_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # unique: a level keeps one set of records; its index also serves the lookup by level
    level_id: Mapped[int] = mapped_column(
        ForeignKey("autotune_levels.id", ondelete="CASCADE"), unique=True
    )
    requests: Mapped[int] = mapped_column(Integer)
    raw_bytes: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RequestStore(StoreBase):
    """Per-request records of stored levels (part of :class:`autotune.store.db.Store`)."""

    def add_requests(self, level_id: int, log: RequestLog) -> None:
        """Keep a stored level's per-request records (retried through an outage; a retry
        first looks for what the first attempt may have landed)."""
        self._retrying(
            f"adding the per-request records of level id {level_id}",
            lambda: self._add_requests(level_id, log),
            landed=lambda: self._landed(level_id),
        )

    def _landed(self, level_id: int) -> NotLanded | None:
        with self._session(f"looking for the records of level id {level_id}") as s:
            found = s.scalar(
                select(LevelRequestsRow.id).where(LevelRequestsRow.level_id == level_id)
            )
            return NOT_LANDED if found is None else None

    def _add_requests(self, level_id: int, log: RequestLog) -> None:
        duplicate = StorageError(f"level id {level_id} already has its per-request records")
        with self._session(
            f"adding the per-request records of level id {level_id}", on_conflict=duplicate
        ) as s:
            if s.get(LevelRow, level_id) is None:
                raise StorageError(f"level id {level_id} does not exist")
            s.add(
                LevelRequestsRow(
                    level_id=level_id,
                    requests=log.requests,
                    raw_bytes=log.raw_bytes,
                    data=log.data,
                )
            )

    def level_requests(self, level_id: int) -> RequestLog | None:
        """A stored level's per-request records, None when it kept none."""
        return self._retrying(
            f"reading the per-request records of level id {level_id}",
            lambda: self._level_requests(level_id),
        )

    def _level_requests(self, level_id: int) -> RequestLog | None:
        with self._session(f"reading the per-request records of level id {level_id}") as s:
            row = s.scalar(select(LevelRequestsRow).where(LevelRequestsRow.level_id == level_id))
            if row is None:
                return None
            return RequestLog(row.requests, row.raw_bytes, bytes(row.data))
