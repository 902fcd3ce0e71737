"""trials: a settled trial's bound and the trial it was settled against
(docs/tuning.md#14-settling-losing-trials)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Trials stored before this revision were all measured in full: no bound.
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("settled_below", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("settled_against", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.drop_column("settled_against")
        batch_op.drop_column("settled_below")
