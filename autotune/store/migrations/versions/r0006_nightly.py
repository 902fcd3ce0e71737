"""nightly decisions and the scheduler's schedules (docs/nightly.md)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_nightly_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("study_name", sa.String(length=200), nullable=True),
        sa.Column("incumbent", sa.JSON(), nullable=False),
        sa.Column("challenger", sa.JSON(), nullable=True),
        sa.Column("deployed", sa.JSON(), nullable=False),
        sa.Column("gain_pct", sa.Float(), nullable=True),
        sa.Column("gain_low", sa.Float(), nullable=True),
        sa.Column("gain_high", sa.Float(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("drift", sa.JSON(), nullable=True),
        sa.Column("profile", sa.JSON(), nullable=True),
        sa.Column("projection", sa.JSON(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("model", sa.String(length=512), nullable=True),
        sa.Column("output_path", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_nightly_decisions")),
    )
    op.create_index(
        op.f("ix_autotune_nightly_decisions_deployment"),
        "autotune_nightly_decisions",
        ["deployment"],
        unique=False,
    )
    op.create_table(
        "autotune_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=False),
        sa.Column("config_path", sa.Text(), nullable=False),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_exit_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_schedules")),
    )
    op.create_index(op.f("ix_autotune_schedules_name"), "autotune_schedules", ["name"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_autotune_schedules_name"), table_name="autotune_schedules")
    op.drop_table("autotune_schedules")
    op.drop_index(
        op.f("ix_autotune_nightly_decisions_deployment"), table_name="autotune_nightly_decisions"
    )
    op.drop_table("autotune_nightly_decisions")
