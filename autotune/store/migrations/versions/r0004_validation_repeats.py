"""validation repeats: the re-measurements of the top configs and the baseline

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_repeats",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("repeat_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("engine_args", sa.JSON(), nullable=False),
        sa.Column("sample", sa.String(length=200), nullable=False),
        sa.Column("workload_seed", sa.BigInteger(), nullable=False),
        sa.Column("jitter_seed", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("slo_held", sa.Boolean(), nullable=True),
        sa.Column("capacity_scale", sa.Float(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("worst_margin", sa.Float(), nullable=True),
        sa.Column("p99_ttft_ms", sa.Float(), nullable=True),
        sa.Column("p99_tpot_ms", sa.Float(), nullable=True),
        sa.Column("overlength_rate", sa.Float(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("levels", sa.Integer(), nullable=False),
        sa.Column("failure_class", sa.String(length=64), nullable=True),
        sa.Column("violations", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["autotune_studies.id"],
            name=op.f("fk_autotune_repeats_study_id_autotune_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_repeats")),
        sa.UniqueConstraint(
            "study_id",
            "repeat_index",
            "trial_number",
            name=op.f("uq_autotune_repeats_study_id_repeat_index_trial_number"),
        ),
    )


def downgrade() -> None:
    op.drop_table("autotune_repeats")
