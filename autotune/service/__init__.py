"""``autotune serve``: the HTTP API over the study database (docs/nightly.md#9-the-service-api)."""

from __future__ import annotations

__all__: list[str] = []
