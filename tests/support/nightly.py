"""Shared by the nightly tests: trace files and nightly configs for sim-virtual."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

NIGHTLY_YAML = """\
deployment: chat
traffic:
  source: traces
  dir: {traces}
  format: trace
  columns: {{timestamp: ts, input_length: in, output_length: out}}
model:
  name: meta-llama/Llama-3.1-8B-Instruct
hardware: A100-80GB
worker:
  kind: sim-virtual
slo:
  p99_ttft_ms: 3000
  p99_tpot_ms: 45
strategy:
  # every trial measured in full: the warm start projects the day's top configs, and a
  # settled trial has no figure to rank (docs/tuning.md#14-settling-losing-trials)
  settle: false
  capacity_low: 0.25
  capacity_high: 8
  capacity_resolution: 0.1
incumbent:
  max_model_len: 3072
drift:
  length_pct: 25
  share_over_pp: 2
budget:
  n_trials: 5
  warm_top_k: 2
  validate_top_k: 1
  repeats: 2
min_gain_pct: 2
output: {output}
dry_run: {dry_run}
"""


def write_trace(
    path: Path,
    *,
    prompt: float = 700.0,
    output: float = 128.0,
    sigma: float = 0.5,
    rate: float = 4.0,
    n: int = 120,
    seed: int = 0,
    mtime: float | None = None,
) -> Path:
    """A JSONL trace (ts, in, out) with lognormal lengths of the given medians."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    p = np.maximum(1, np.round(rng.lognormal(np.log(prompt), sigma, n))).astype(int)
    o = np.maximum(1, np.round(rng.lognormal(np.log(output), sigma, n))).astype(int)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for a, b, c in zip(t, p, o, strict=True):
            f.write(json.dumps({"ts": float(a), "in": int(b), "out": int(c)}) + "\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def write_config(folder: Path, *, dry_run: bool = False, name: str = "nightly.yaml") -> Path:
    cfg = folder / name
    cfg.write_text(
        NIGHTLY_YAML.format(
            traces=folder / "traces",
            output=folder / "out" / "chat.yaml",
            dry_run=str(dry_run).lower(),
        ),
        encoding="utf-8",
    )
    return cfg
