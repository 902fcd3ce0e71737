"""Alembic environment for autotune's tables.

Run only through :mod:`autotune.store.migrate`, which supplies the connection (inside a
transaction it owns) instead of an alembic.ini, and the settings that keep us clear of
Optuna's tables in the same database.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import JSON
from sqlalchemy.types import TypeDecorator

from autotune.store.migrate import VERSION_TABLE, include_object
from autotune.store.rows import Base


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our column types as their plain SQLAlchemy base, so revision scripts do not
    import autotune's models (a later change to a model must not rewrite history)."""
    if type_ != "type" or not isinstance(obj, TypeDecorator):
        return False
    impl = obj.impl_instance
    # JSON's arguments (none_as_null, ...) are Python-side only: the DDL is plain JSON.
    return "sa.JSON()" if isinstance(impl, JSON) else f"sa.{impl!r}"


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None or context.is_offline_mode():
        raise RuntimeError(
            "autotune's migrations run through autotune.store.migrate "
            "(`autotune db upgrade`), which passes the connection"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_item=render_item,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch ops work on both
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
