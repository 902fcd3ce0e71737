"""Databases for the store contract: one fresh, upgraded SQLite file or PostgreSQL database
per use, and the study, trial and level records the store tests write.

PostgreSQL tests connect to ``$AUTOTUNE_TEST_PG_URL`` (default: database ``test`` on
127.0.0.1:5432 as ``postgres``) only to create and drop ``autotune_test_<random>`` databases;
with CI=true a missing server fails them instead of skipping.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from autotune.store import LevelRecord, StudyRecord, TrialRecord

from .services import need_service

__all__ = [
    "BACKENDS",
    "OUR_TABLES",
    "PG_ADMIN_URL",
    "fresh_database",
    "libpq_url",
    "make_level",
    "make_study",
    "make_trial",
    "pg_status",
]

PG_ADMIN_URL = os.environ.get(
    "AUTOTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
OUR_TABLES = {
    "autotune_studies",
    "autotune_trials",
    "autotune_levels",
    "autotune_level_requests",
    "autotune_controllers",
    "autotune_workers",
    "autotune_claims",
    "autotune_repeats",
    "autotune_nightly_decisions",
    "autotune_schedules",
    "autotune_alembic_version",
}


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL as libpq (psycopg) reads it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@functools.cache
def pg_status() -> tuple[bool, str]:
    """(reachable, why not) for the PostgreSQL admin URL, asked once per session."""
    try:
        psycopg.connect(libpq_url(PG_ADMIN_URL), connect_timeout=3).close()
    except psycopg.Error as exc:
        return False, f"{make_url(PG_ADMIN_URL)!s}: {str(exc).splitlines()[0]}"
    return True, ""


@contextmanager
def fresh_database(backend: str, folder: Path) -> Iterator[str]:
    """The URL of an empty database, dropped (PostgreSQL) afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / f'autotune_{secrets.token_hex(4)}.db'}"
        return
    need_service("postgres", *pg_status())
    name = f"autotune_test_{secrets.token_hex(6)}"
    with psycopg.connect(libpq_url(PG_ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq_url(PG_ADMIN_URL), autocommit=True) as conn:
            # FORCE: Optuna's engines may still hold connections to it.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_study(name: str) -> StudyRecord:
    return StudyRecord(
        name=name,
        config_yaml=f"name: {name}\n",
        mode="slo-capacity",
        workload_profile={"input_len": {"p50": 512, "p99": 2048}, "n": 500},
        worker_kind="sim-virtual",
        optuna_study_name=f"optuna-{name}",
    )


def make_level(index: int, **over: Any) -> LevelRecord:
    level = LevelRecord(
        level_index=index,
        scale=0.5 * (index + 1),
        offered_rate=2.0 * (index + 1),
        achieved_rate=1.9 * (index + 1),
        completed=100,
        failed=1,
        over_length=0,
        error_rate=0.01,
        p99_ttft_ms=120.5,
        p99_tpot_ms=None,
        p99_itl_ms=30.25,
        output_throughput=1500.0,
        request_throughput=9.5,
        goodput=None,
        feasible=index < 2,
        metrics={"completed": 100, "ttfts": [0.1, 0.2], "percentiles": {"99": 120.5}},
        telemetry={"kv_usage_max": 0.93} if index else None,
        diagnosis=None,
    )
    return replace(level, **over)


def make_trial(
    study: str, number: int, levels: list[LevelRecord] | None = None, **over: Any
) -> TrialRecord:
    trial = TrialRecord(
        study_name=study,
        optuna_trial_number=number,
        stage="max_num_seqs",
        state="RUNNING",
        params={"max_num_seqs": 128, "gpu_memory_utilization": 0.9},
        engine_args={"max_num_seqs": 128, "max_model_len": 4096, "enable_prefix_caching": True},
        launch_command="vllm serve m --max-num-seqs 128",
        launch_argv=["vllm", "serve", "m", "--max-num-seqs", "128"],
        worker_kind="sim",
        startup_s=12.5,
        kv_cache_tokens=3_000_000_000,
        max_concurrency=45.5,
        constraints=[-1.0, 0.5],
        diagnosis={"bottleneck": "kv"},
        started_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2))),
        levels=[make_level(i) for i in range(3)] if levels is None else levels,
    )
    return replace(trial, **over)
