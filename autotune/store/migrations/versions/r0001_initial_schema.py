"""initial schema: studies, trials and their load levels

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config_yaml", sa.Text(), nullable=False),
        sa.Column("workload_profile", sa.JSON(), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("worker_kind", sa.String(length=32), nullable=False),
        sa.Column("optuna_study_name", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_studies")),
    )
    with op.batch_alter_table("autotune_studies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_autotune_studies_name"), ["name"], unique=True)

    op.create_table(
        "autotune_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("optuna_trial_number", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("engine_args", sa.JSON(), nullable=False),
        sa.Column("launch_command", sa.Text(), nullable=True),
        sa.Column("launch_argv", sa.JSON(), nullable=True),
        sa.Column("worker_kind", sa.String(length=32), nullable=False),
        sa.Column("startup_s", sa.Float(), nullable=True),
        sa.Column("kv_cache_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrency", sa.Float(), nullable=True),
        sa.Column("failure_class", sa.String(length=64), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("constraints", sa.JSON(), nullable=False),
        sa.Column("feasible", sa.Boolean(), nullable=True),
        sa.Column("capacity_scale", sa.Float(), nullable=True),
        sa.Column("diagnosis", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["autotune_studies.id"],
            name=op.f("fk_autotune_trials_study_id_autotune_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_trials")),
        sa.UniqueConstraint(
            "study_id",
            "optuna_trial_number",
            name=op.f("uq_autotune_trials_study_id_optuna_trial_number"),
        ),
    )
    op.create_table(
        "autotune_levels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("level_index", sa.Integer(), nullable=False),
        sa.Column("scale", sa.Float(), nullable=False),
        sa.Column("offered_rate", sa.Float(), nullable=True),
        sa.Column("achieved_rate", sa.Float(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("over_length", sa.Integer(), nullable=False),
        sa.Column("error_rate", sa.Float(), nullable=False),
        sa.Column("p99_ttft_ms", sa.Float(), nullable=True),
        sa.Column("p99_tpot_ms", sa.Float(), nullable=True),
        sa.Column("p99_itl_ms", sa.Float(), nullable=True),
        sa.Column("output_throughput", sa.Float(), nullable=False),
        sa.Column("request_throughput", sa.Float(), nullable=False),
        sa.Column("goodput", sa.Float(), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("telemetry", sa.JSON(), nullable=True),
        sa.Column("diagnosis", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["autotune_trials.id"],
            name=op.f("fk_autotune_levels_trial_id_autotune_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_levels")),
        sa.UniqueConstraint(
            "trial_id",
            "level_index",
            name=op.f("uq_autotune_levels_trial_id_level_index"),
        ),
    )


def downgrade() -> None:
    op.drop_table("autotune_levels")
    op.drop_table("autotune_trials")
    with op.batch_alter_table("autotune_studies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_autotune_studies_name"))
    op.drop_table("autotune_studies")
