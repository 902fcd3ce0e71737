"""levels: each level's per-request records, gzip-compressed requests-jsonl
(docs/loadgen.md#6-per-request-records)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A table of its own, not a column of autotune_levels: reading trials never loads the
    # records. Levels stored before this revision, and studies without record.requests,
    # have no row.
    op.create_table(
        "autotune_level_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("level_id", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("raw_bytes", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["level_id"],
            ["autotune_levels.id"],
            name=op.f("fk_autotune_level_requests_level_id_autotune_levels"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_level_requests")),
        sa.UniqueConstraint("level_id", name=op.f("uq_autotune_level_requests_level_id")),
    )


def downgrade() -> None:
    op.drop_table("autotune_level_requests")
