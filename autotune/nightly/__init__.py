"""Scheduled nightly retuning (docs/nightly.md): refresh the workload from real traffic,
detect drift, warm-start a dated study from the incumbent and the previous study, promote
only what is better beyond noise, and record every decision."""

from __future__ import annotations

__all__: list[str] = []
