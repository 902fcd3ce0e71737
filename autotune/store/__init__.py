"""The study store: studies, trials, load levels and validation runs, in the database
Optuna also uses.

Open it with :meth:`Store.open` (a URL, ``$AUTOTUNE_DATABASE_URL`` or ``sqlite:///autotune.db``)
and exchange the plain records of :mod:`autotune.store.records`; nothing outside this
package sees SQLAlchemy. Schema changes are Alembic revisions (:mod:`autotune.store.migrate`).
"""

from __future__ import annotations

from autotune.store.db import DEFAULT_URL, ENV_VAR, NoDatabaseError, Store, resolve_url
from autotune.store.migrate import VERSION_TABLE
from autotune.store.records import (
    LevelRecord,
    RepeatRecord,
    RequestLog,
    StudyRecord,
    StudySummary,
    TrialRecord,
    WorkerUsage,
)

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "VERSION_TABLE",
    "LevelRecord",
    "NoDatabaseError",
    "RepeatRecord",
    "RequestLog",
    "Store",
    "StudyRecord",
    "StudySummary",
    "TrialRecord",
    "WorkerUsage",
    "resolve_url",
]
