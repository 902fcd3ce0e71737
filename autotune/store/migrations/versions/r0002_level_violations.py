"""levels: truncated requests, the over-length rate and the violations in words

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Levels stored before this revision read back with no truncated requests, the over-length
    # rate 0 and no violation texts (their `metrics` JSON still holds the raw counts).
    with op.batch_alter_table("autotune_levels", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("truncated", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("overlength_rate", sa.Float(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("violations", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("autotune_levels", schema=None) as batch_op:
        batch_op.drop_column("violations")
        batch_op.drop_column("overlength_rate")
        batch_op.drop_column("truncated")
