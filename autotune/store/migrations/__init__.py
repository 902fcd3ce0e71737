"""autotune's Alembic environment and revisions; run them via autotune.store.migrate."""
