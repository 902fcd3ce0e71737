"""The study config's ``record`` section: what a study keeps beyond its configs, commands and
levels, which it always stores in its database. Off by default (docs/usage.md)."""

from __future__ import annotations

from pydantic import Field

from autotune.config.model_base import ConfigModel

__all__ = ["RecordConfig"]


class RecordConfig(ConfigModel):
    """``git``: a folder inside a git working tree (created and initialised when missing)
    where each trial, the validation, the recommendation and nightly decisions are committed
    as files. ``requests``: keep every measured request's record per level in the database
    (compressed JSONL), for the per-request exports."""

    git: str | None = Field(None, min_length=1, description="folder in a git repository")
    requests: bool = False
