"""controllers, their workers and their claims (docs/faults.md#2-controllers-workers-and-claims)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

Other branches add revisions too: whoever merges re-chains ``down_revision`` to the head.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_controllers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("proc_start", sa.BigInteger(), nullable=True),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idle_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("trials_run", sa.Integer(), server_default="0", nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["autotune_studies.id"],
            name=op.f("fk_autotune_controllers_study_id_autotune_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_controllers")),
    )
    with op.batch_alter_table("autotune_controllers", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_autotune_controllers_study_id"), ["study_id"], unique=False
        )

    op.create_table(
        "autotune_claims",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("stage", sa.String(length=64), nullable=True),
        sa.Column("controller_id", sa.Integer(), nullable=True),
        sa.Column("lane", sa.Integer(), server_default="0", nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(
            ["controller_id"],
            ["autotune_controllers.id"],
            name=op.f("fk_autotune_claims_controller_id_autotune_controllers"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["autotune_studies.id"],
            name=op.f("fk_autotune_claims_study_id_autotune_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_claims")),
        sa.UniqueConstraint("study_id", "key", name=op.f("uq_autotune_claims_study_id_key")),
    )
    op.create_table(
        "autotune_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("controller_id", sa.Integer(), nullable=False),
        sa.Column("trial_name", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pgid", sa.Integer(), nullable=False),
        sa.Column("proc_start", sa.BigInteger(), nullable=True),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        sa.Column("tmpdir", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["controller_id"],
            ["autotune_controllers.id"],
            name=op.f("fk_autotune_workers_controller_id_autotune_controllers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_workers")),
    )
    with op.batch_alter_table("autotune_workers", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_autotune_workers_controller_id"), ["controller_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("autotune_workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_autotune_workers_controller_id"))

    op.drop_table("autotune_workers")
    op.drop_table("autotune_claims")
    with op.batch_alter_table("autotune_controllers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_autotune_controllers_study_id"))

    op.drop_table("autotune_controllers")
