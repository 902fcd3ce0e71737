"""Refresh the workload from today's traffic (docs/nightly.md#2-refreshing-the-workload):
the newest trace file of the configured folder (preferred), or Prometheus's histograms
(:mod:`autotune.nightly.promfit`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autotune.config import WorkloadConfig
from autotune.errors import ConfigError
from autotune.nightly.drift import TrafficProfile, traffic_profile
from autotune.nightly.job_config import NightlyConfig
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

__all__ = ["Refresh", "newest_trace", "profile_of_workload", "refresh"]


@dataclass
class Refresh:
    workload: dict[str, Any]  # the dated study's ``workload:`` section
    profile: TrafficProfile
    source: str
    warnings: list[str] = field(default_factory=list)


def newest_trace(folder: str | Path, pattern: str) -> Path:
    """The newest file of ``folder`` matching ``pattern`` (by modification time, then name)."""
    d = Path(folder)
    if not d.is_dir():
        raise ConfigError(f"traffic.dir: {d} is not a folder")
    files = [p for p in d.glob(pattern) if p.is_file()]
    if not files:
        raise ConfigError(f"traffic.dir: no file in {d} matches {pattern!r}")
    return max(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def profile_of_workload(wl: Workload, source: str) -> TrafficProfile:
    prompt = np.fromiter((r.prompt_len for r in wl.requests), dtype=float, count=len(wl))
    output = np.fromiter((r.output_len for r in wl.requests), dtype=float, count=len(wl))
    rate = wl.profile().mean_rate
    return traffic_profile(prompt, output, rate, source=source)


def refresh(cfg: NightlyConfig, *, vocab_size: int) -> Refresh:
    """Today's workload section and its profile."""
    t = cfg.traffic
    if t.source == "prometheus":
        from autotune.nightly.promfit import refresh_from_prometheus

        return refresh_from_prometheus(cfg)
    assert t.dir is not None
    path = newest_trace(t.dir, t.pattern)
    section: dict[str, Any] = {
        "source": t.format,
        "path": str(path.resolve()),
        "num_prompts": t.max_requests,
        "arrival": "trace",
        "time_scale": t.time_scale,
        "seed": t.seed,
    }
    if t.columns:
        section["columns"] = dict(t.columns)
    wl = build_workload(WorkloadConfig.model_validate(section), vocab_size=vocab_size)
    source = f"{path.name} ({len(wl)} requests)"
    return Refresh(section, profile_of_workload(wl, source), source)
