"""trials and validation runs: what each worker cost on its devices (docs/cost.md)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("autotune_trials", "autotune_repeats")


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("worker_s", sa.Float(), nullable=True),
        sa.Column("worker_startup_s", sa.Float(), nullable=True),
        sa.Column("replayed_s", sa.Float(), nullable=True),
        sa.Column("devices_held", sa.Integer(), nullable=True),
        sa.Column("cost_modelled", sa.Boolean(), nullable=True),
    ]


def upgrade() -> None:
    # Rows stored before this revision read back with no cost (unknown), never as zero.
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in _columns():
                batch_op.add_column(column)


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in reversed(_columns()):
                batch_op.drop_column(column.name)
