"""trials: the measured trial an inferred trial's levels were read from
(docs/tuning.md#14-settling-losing-trials, "A limit the engine never reached")

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Trials stored before this revision were all measured on a worker of their own.
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inferred_from", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.drop_column("inferred_from")
