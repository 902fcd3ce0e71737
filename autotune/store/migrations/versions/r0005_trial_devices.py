"""trials: the devices a trial's worker saw (docs/parallel.md#3-what-is-recorded)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10

0004 (validation repeats) is another branch's revision, already on main: merging this one
sets ``down_revision`` to "0004".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Trials stored before this revision read back with no device set (unknown).
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("devices", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.drop_column("devices")
