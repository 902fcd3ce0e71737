"""The store's tables (SQLAlchemy 2 declarative) and the column types both backends share.

Every table and constraint name starts with ``autotune_`` (constraints get it from the
table name through the naming convention) because the database is shared with Optuna's RDB
storage, whose tables (``studies``, ``trials``, ``alembic_version``, ...) must never be
touched. Named constraints also let later Alembic batch migrations on SQLite alter them.

Changing a column here needs a new revision in ``autotune/store/migrations/versions``
(``python -m autotune.store.migrations revision "what changed"``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

__all__ = [
    "TABLE_PREFIX",
    "Base",
    "ClaimRow",
    "ControllerRow",
    "FiniteFloat",
    "Json",
    "LevelRow",
    "NightlyDecisionRow",
    "RepeatRow",
    "ScheduleRow",
    "StudyRow",
    "TrialRow",
    "UTCDateTime",
    "WorkerCostColumns",
    "WorkerRow",
]

TABLE_PREFIX = "autotune_"

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _json_safe(value: Any) -> Any:
    """Make ``value`` storable as JSON on every backend.

    NaN and ±Infinity become ``None`` (JSON has no spelling for them and PostgreSQL's
    ``json`` type rejects the ``NaN`` token Python would write); NumPy scalars and arrays,
    which metric code produces, become plain Python values.
    """
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class Json(TypeDecorator[Any]):
    """``sqlalchemy.JSON`` that stores the same thing on SQLite and PostgreSQL."""

    # SQL NULL, not the JSON text 'null', for a missing value: "IS NULL" then finds it.
    impl = JSON(none_as_null=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return _json_safe(value)


class FiniteFloat(TypeDecorator[float]):
    """A float column where NaN means "no value": SQLite silently turns NaN into NULL, so
    PostgreSQL is made to do the same instead of answering differently."""

    impl = Float
    cache_ok = True

    def process_bind_param(self, value: float | None, dialect: Dialect) -> float | None:
        if value is None or math.isnan(value):
            return None
        return float(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware timestamps, stored as UTC and read back aware on every backend.

    SQLite has no timezone support (it would drop the offset and hand back naive values),
    so the value is converted to UTC before storing and marked UTC when read. Naive input is
    refused rather than guessed at: ``datetime.now()`` is local time, not UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"timestamp {value.isoformat()} has no timezone; "
                "use datetime.now(UTC) or another aware datetime"
            )
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class WorkerCostColumns:
    """Revision 0007: what a trial's or validation run's worker cost (docs/cost.md), the
    columns of ``_WorkerCostFields`` in :mod:`autotune.store.records`."""

    worker_s: Mapped[float | None] = mapped_column(FiniteFloat)
    worker_startup_s: Mapped[float | None] = mapped_column(FiniteFloat)
    replayed_s: Mapped[float | None] = mapped_column(FiniteFloat)
    devices_held: Mapped[int | None] = mapped_column(Integer)
    cost_modelled: Mapped[bool | None] = mapped_column(Boolean)


class StudyRow(Base):
    __tablename__ = "autotune_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, index=True)
    config_yaml: Mapped[str] = mapped_column(Text)
    workload_profile: Mapped[dict[str, Any]] = mapped_column(Json)
    mode: Mapped[str] = mapped_column(String(32))
    worker_kind: Mapped[str] = mapped_column(String(32))
    # Optuna's own column is String(512).
    optuna_study_name: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    trials: Mapped[list[TrialRow]] = relationship(
        back_populates="study",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="TrialRow.optuna_trial_number",
    )


class TrialRow(WorkerCostColumns, Base):
    __tablename__ = "autotune_trials"
    # Its index also serves "the trials of a study, by number": no separate study_id index.
    __table_args__ = (UniqueConstraint("study_id", "optuna_trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id", ondelete="CASCADE"))
    optuna_trial_number: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(Json)
    engine_args: Mapped[dict[str, Any]] = mapped_column(Json)
    launch_command: Mapped[str | None] = mapped_column(Text)
    launch_argv: Mapped[list[str] | None] = mapped_column(Json)
    worker_kind: Mapped[str] = mapped_column(String(32))
    startup_s: Mapped[float | None] = mapped_column(FiniteFloat)
    kv_cache_tokens: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrency: Mapped[float | None] = mapped_column(FiniteFloat)
    failure_class: Mapped[str | None] = mapped_column(String(64))
    log_tail: Mapped[str | None] = mapped_column(Text)
    objective: Mapped[float | None] = mapped_column(FiniteFloat)
    constraints: Mapped[list[float]] = mapped_column(Json)
    feasible: Mapped[bool | None] = mapped_column(Boolean)
    capacity_scale: Mapped[float | None] = mapped_column(FiniteFloat)
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(Json)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # revision 0005: the CUDA_VISIBLE_DEVICES the trial's worker got (None: not set)
    devices: Mapped[str | None] = mapped_column(String(512))
    # revision 0008: a settled trial's bound and the trial it was settled against
    settled_below: Mapped[float | None] = mapped_column(FiniteFloat)
    settled_against: Mapped[int | None] = mapped_column(Integer)
    # revision 0010: the trial whose levels an inferred trial's are (no worker of its own)
    inferred_from: Mapped[int | None] = mapped_column(Integer)

    study: Mapped[StudyRow] = relationship(back_populates="trials")
    levels: Mapped[list[LevelRow]] = relationship(
        back_populates="trial",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="LevelRow.level_index",
    )


class LevelRow(Base):
    __tablename__ = "autotune_levels"
    # Its index also serves "the levels of a trial, in order".
    __table_args__ = (UniqueConstraint("trial_id", "level_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id", ondelete="CASCADE"))
    level_index: Mapped[int] = mapped_column(Integer)
    scale: Mapped[float] = mapped_column(FiniteFloat)
    offered_rate: Mapped[float | None] = mapped_column(FiniteFloat)
    achieved_rate: Mapped[float] = mapped_column(FiniteFloat)
    completed: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    over_length: Mapped[int] = mapped_column(Integer)
    error_rate: Mapped[float] = mapped_column(FiniteFloat)
    p99_ttft_ms: Mapped[float | None] = mapped_column(FiniteFloat)
    p99_tpot_ms: Mapped[float | None] = mapped_column(FiniteFloat)
    p99_itl_ms: Mapped[float | None] = mapped_column(FiniteFloat)
    output_throughput: Mapped[float] = mapped_column(FiniteFloat)
    request_throughput: Mapped[float] = mapped_column(FiniteFloat)
    goodput: Mapped[float | None] = mapped_column(FiniteFloat)
    feasible: Mapped[bool] = mapped_column(Boolean)
    metrics: Mapped[dict[str, Any]] = mapped_column(Json)
    telemetry: Mapped[dict[str, Any] | None] = mapped_column(Json)
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # revision 0002
    truncated: Mapped[int] = mapped_column(Integer, server_default="0")
    overlength_rate: Mapped[float] = mapped_column(FiniteFloat, server_default="0")
    violations: Mapped[list[dict[str, Any]]] = mapped_column(Json, server_default="[]")

    trial: Mapped[TrialRow] = relationship(back_populates="levels")


# -- revision 0003: the controllers sharing a study, their workers and their claims --------
# (docs/faults.md#2-controllers-workers-and-claims)


class ControllerRow(Base):
    """One ``autotune study run`` process. ``proc_start`` (clock ticks after boot, from
    /proc/PID/stat) and ``boot_id`` tell a live controller from a reused pid."""

    __tablename__ = "autotune_controllers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(
        ForeignKey("autotune_studies.id", ondelete="CASCADE"), index=True
    )
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    proc_start: Mapped[int | None] = mapped_column(BigInteger)
    boot_id: Mapped[str | None] = mapped_column(String(64))
    # running | stopped | interrupted | failed | dead (found dead by another controller)
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idle_s: Mapped[float] = mapped_column(FiniteFloat, server_default="0")
    trials_run: Mapped[int] = mapped_column(Integer, server_default="0")
    note: Mapped[str | None] = mapped_column(Text)


class WorkerRow(Base):
    """One worker process group a controller started (``pgid`` = its leader's pid)."""

    __tablename__ = "autotune_workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    controller_id: Mapped[int] = mapped_column(
        ForeignKey("autotune_controllers.id", ondelete="CASCADE"), index=True
    )
    trial_name: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    pgid: Mapped[int] = mapped_column(Integer)
    proc_start: Mapped[int | None] = mapped_column(BigInteger)
    boot_id: Mapped[str | None] = mapped_column(String(64))
    tmpdir: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # running | stopped | reaped
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ClaimRow(Base):
    """Who runs what: one row per claimed trial (``key`` ``trial:N``) or other unit of work
    (a validation run), unique per study, so each is claimed exactly once."""

    __tablename__ = "autotune_claims"
    __table_args__ = (UniqueConstraint("study_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    stage: Mapped[str | None] = mapped_column(String(64))
    controller_id: Mapped[int | None] = mapped_column(
        ForeignKey("autotune_controllers.id", ondelete="SET NULL")
    )
    lane: Mapped[int] = mapped_column(Integer, server_default="0")
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(String(16))  # COMPLETE | FAIL | ABANDONED


class RepeatRow(WorkerCostColumns, Base):
    """A validation run (revision 0004): not an Optuna trial, so trial counts and the
    dashboard stay the search's own."""

    __tablename__ = "autotune_repeats"
    # one run per (repeat, trial); its index also serves "a study's runs, in order"
    __table_args__ = (UniqueConstraint("study_id", "repeat_index", "trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id", ondelete="CASCADE"))
    repeat_index: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    trial_number: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    engine_args: Mapped[dict[str, Any]] = mapped_column(Json)
    sample: Mapped[str] = mapped_column(String(200))
    workload_seed: Mapped[int] = mapped_column(BigInteger)
    jitter_seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    slo_held: Mapped[bool | None] = mapped_column(Boolean)
    capacity_scale: Mapped[float | None] = mapped_column(FiniteFloat)
    objective: Mapped[float | None] = mapped_column(FiniteFloat)
    worst_margin: Mapped[float | None] = mapped_column(FiniteFloat)
    p99_ttft_ms: Mapped[float | None] = mapped_column(FiniteFloat)
    p99_tpot_ms: Mapped[float | None] = mapped_column(FiniteFloat)
    overlength_rate: Mapped[float | None] = mapped_column(FiniteFloat)
    requests: Mapped[int] = mapped_column(Integer)
    levels: Mapped[int] = mapped_column(Integer)
    failure_class: Mapped[str | None] = mapped_column(String(64))
    violations: Mapped[list[str]] = mapped_column(Json)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class NightlyDecisionRow(Base):
    """One nightly job's decision for a deployment (revision 0006, docs/nightly.md): what
    was in use, the best challenger, the gain with its interval, the decision and why, the
    drift figures and the dated study. ``deployed`` is the config in use after it."""

    __tablename__ = "autotune_nightly_decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment: Mapped[str] = mapped_column(String(100), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # keep | promote | none-feasible | rollback
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    study_name: Mapped[str | None] = mapped_column(String(200))
    incumbent: Mapped[dict[str, Any]] = mapped_column(Json)
    challenger: Mapped[dict[str, Any] | None] = mapped_column(Json)
    deployed: Mapped[dict[str, Any]] = mapped_column(Json)
    gain_pct: Mapped[float | None] = mapped_column(FiniteFloat)
    gain_low: Mapped[float | None] = mapped_column(FiniteFloat)
    gain_high: Mapped[float | None] = mapped_column(FiniteFloat)
    confidence: Mapped[float | None] = mapped_column(FiniteFloat)
    drift: Mapped[dict[str, Any] | None] = mapped_column(Json)
    profile: Mapped[dict[str, Any] | None] = mapped_column(Json)
    projection: Mapped[list[Any] | None] = mapped_column(Json)
    command: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(String(512))
    output_path: Mapped[str | None] = mapped_column(Text)
    dry_run: Mapped[bool] = mapped_column(Boolean, server_default="0")
    exit_code: Mapped[int] = mapped_column(Integer)


class ScheduleRow(Base):
    """A stored schedule of ``autotune scheduler`` (revision 0006): a cron expression (UTC
    unless ``timezone`` says otherwise) and the nightly config it runs. ``last_fire_at`` is
    the scheduled time of the last run started, so a restarted scheduler never runs one
    fire time twice."""

    __tablename__ = "autotune_schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True, index=True)
    cron: Mapped[str] = mapped_column(String(200))
    config_path: Mapped[str] = mapped_column(Text)
    timezone: Mapped[str] = mapped_column(String(64), server_default="UTC")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_fire_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_exit_code: Mapped[int | None] = mapped_column(Integer)
