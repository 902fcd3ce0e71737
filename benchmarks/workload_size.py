"""Workload size: autotune's estimate of memory and time against a measurement.

`study create` estimates, for workloads over 1,000 prompts, the controller's peak memory and
the time of one load level (autotune/sizing.py), and refuses a study estimated above 1.5 GB.
This runs `autotune study create --allow-large-workload` on configs/quickstart.yaml with N
prompts in a child process (slo-capacity: create runs the baseline's capacity probe, one load
level at a time), measures its peak RSS and wall time, and prints them beside the estimate.
The baseline, measured in the same run, is the same create at 1,000 prompts (the sample the
estimate simulates). Target: the estimate within 2x of the measurement, for memory and for
time (create's levels x the estimated time per level). Ends with one JSON line.

Usage: python benchmarks/workload_size.py [--quick] [--prompts N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.config import parse_config  # noqa: E402
from autotune.profiles.hardware import get_hardware  # noqa: E402
from autotune.profiles.models import get_model  # noqa: E402
from autotune.sizing import estimate  # noqa: E402

CONFIG = ROOT / "configs" / "quickstart.yaml"


def config_text(n: int) -> str:
    d = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    d["workload"]["num_prompts"] = n
    d["name"] = f"size-{n}"
    return yaml.safe_dump(d)


def measure(n: int, tmp: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS bytes) of `autotune study create` on ``n`` prompts."""
    path = tmp / f"size-{n}.yaml"
    path.write_text(config_text(n), encoding="utf-8")
    cmd = [sys.executable, "-m", "autotune.cli", "study", "create", "--config", str(path)]
    cmd += ["--storage", f"sqlite:///{tmp / f'size-{n}.db'}", "--allow-large-workload"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    # one child at a time: RUSAGE_CHILDREN's maxrss is the largest child so far
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: create of {n} prompts failed: {proc.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:
        raise SystemExit("error: children are measured in increasing size; run smaller first")
    return wall, peak * 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="20,000 prompts")
    ns = ap.parse_args()
    n = 20_000 if ns.quick else ns.prompts
    cfg = parse_config(config_text(n), str(CONFIG))
    model, hw = get_model(cfg.model.name), get_hardware(cfg.hardware)
    t0 = time.perf_counter()
    est = estimate(cfg, model, hw)
    est_cost = time.perf_counter() - t0
    assert est is not None
    with tempfile.TemporaryDirectory() as tmp:
        base_wall, base_rss = measure(1000, Path(tmp))
        wall, rss = measure(n, Path(tmp))
    est_create = est.create_s
    mem_ratio, time_ratio = est.peak_bytes / rss, est_create / wall
    print(f"workload: configs/quickstart.yaml with {n:,} prompts ({est.create_levels} levels)")
    print(f"baseline, 1,000 prompts: create {base_wall:.1f} s, peak RSS {base_rss / 1e9:.2f} GB")
    print(f"measured, {n:,} prompts: create {wall:.1f} s, peak RSS {rss / 1e9:.2f} GB")
    print(
        f"estimated ({est_cost:.1f} s to estimate): peak {est.peak_bytes / 1e9:.2f} GB "
        f"(x{mem_ratio:.2f} of measured), {est.level_s:.1f} s per level -> create "
        f"{est_create:.1f} s (x{time_ratio:.2f} of measured)"
    )
    ok = 0.5 <= mem_ratio <= 2.0 and 0.5 <= time_ratio <= 2.0
    print("target: estimate within 2x of measured memory and time:", "met" if ok else "MISSED")
    print(
        json.dumps(
            {
                "benchmark": "workload_size",
                "prompts": n,
                "measured_create_s": round(wall, 2),
                "measured_peak_rss_gb": round(rss / 1e9, 3),
                "estimated_create_s": round(est_create, 2),
                "estimated_peak_gb": round(est.peak_bytes / 1e9, 3),
                "memory_ratio": round(mem_ratio, 3),
                "time_ratio": round(time_ratio, 3),
                "baseline_1000_create_s": round(base_wall, 2),
                "baseline_1000_peak_rss_gb": round(base_rss / 1e9, 3),
                "target_met": ok,
            }
        )
    )


if __name__ == "__main__":
    main()
