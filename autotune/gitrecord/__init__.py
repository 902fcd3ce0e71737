"""The git record (docs/git-record.md): each trial's `vllm serve` command, engine args, load
levels and result, then the validation, the recommendation and the nightly decisions,
committed to a git repository so that a change in performance can be traced to the change of
config that made it."""

from __future__ import annotations

__all__: list[str] = []
