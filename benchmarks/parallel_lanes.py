"""Parallel trial lanes (``study run --gpus``, docs/parallel.md) against one lane, same run.

One study of ``sim`` workers (real server processes; Llama-3.1-8B on A100-80GB, fixed rate)
whose plan is the baseline and three copies of it (``enqueue: [{}, {}, {}]``): four trials of
one configuration. Baseline, measured in the same run: the study run with one lane (no
``--gpus``). Then a fresh copy run with ``--gpus 0,1,2,3`` (fake devices: the simulator
ignores them). Figures: the run's wall time, and each trial's output tok/s and p99 TTFT, so
that what parallel lanes cost in measurement (the simulated servers and the load generator
share this host's CPU cores) is visible beside what they save in time.

Ends with one JSON line. Usage: python benchmarks/parallel_lanes.py [--time-scale X]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from autotune.config import parse_config
from autotune.store import Store
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study


def study(tmp: Path, name: str, time_scale: float) -> str:
    d: dict[str, Any] = {
        "name": name,
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "hardware": "A100-80GB",
        "mode": "fixed-rate",
        "worker": {"kind": "sim", "time_scale": time_scale, "workdir": str(tmp / "w")},
        "workload": {
            "source": "synthetic",
            "num_prompts": 60,
            "input_len": 512,
            "output_len": 64,
            "arrival": "poisson",
            "rate": 6,
            "seed": 0,
        },
        "slo": {"p99_ttft_ms": 30000, "p99_tpot_ms": 1000},
        "strategy": {"name": "joint", "n_trials": 4},
        "enqueue": [{}, {}, {}],
        "controller": {"heartbeat_interval_s": 1, "grace_period_s": 10, "db_outage_tolerance_s": 6},
    }
    return yaml.safe_dump(d)


def run(tmp: Path, name: str, time_scale: float, gpus: str | None) -> dict[str, Any]:
    url = f"sqlite:///{tmp / (name + '.db')}"
    text = study(tmp, name, time_scale)
    with Store.open(url) as store:
        create_study(parse_config(text, f"{name}.yaml"), text, store)
        t0 = time.perf_counter()
        report = run_study(name, store, gpus=gpus)
        wall = time.perf_counter() - t0
        trials = store.trials(name)
    assert report.trials_run == 4 and all(t.state == "COMPLETE" for t in trials)
    tok = [t.levels[0].output_throughput for t in trials]
    ttft = [t.levels[0].p99_ttft_ms or 0.0 for t in trials]
    return {
        "lanes": 1 if gpus is None else len(gpus.split(",")),
        "wall_s": round(wall, 2),
        "tok_s": [round(x, 1) for x in tok],
        "p99_ttft_ms": [round(x, 1) for x in ttft],
        "tok_s_mean": round(statistics.fmean(tok), 1),
        "p99_ttft_ms_mean": round(statistics.fmean(ttft), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=4.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = run(tmp, "one-lane", args.time_scale, None)
        four = run(tmp, "four-lanes", args.time_scale, "0,1,2,3")
    print(f"host: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
    for r in (one, four):
        print(
            f"{r['lanes']} lane(s): {r['wall_s']:.1f} s wall; output tok/s {r['tok_s']} "
            f"(mean {r['tok_s_mean']}); p99 TTFT ms {r['p99_ttft_ms']} "
            f"(mean {r['p99_ttft_ms_mean']})"
        )
    speedup = one["wall_s"] / four["wall_s"]
    print(f"speed-up {speedup:.2f}x")
    print(json.dumps({"one_lane": one, "four_lanes": four, "speedup": round(speedup, 2)}))


if __name__ == "__main__":
    main()
