"""Alembic revision scripts for autotune's tables (see autotune.store.migrate)."""
