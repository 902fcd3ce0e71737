"""Does validation resolve a gain on a trace with one rare long request?
(docs/tuning.md#7-validation, "Fresh samples, fresh noise").

Each seed writes a 400-request trace (log-normal lengths, Poisson arrivals) in which one
request is 5x longer (prompt + output) than the 99th percentile of the trace, then measures
two configs on the in-process simulator (``sim-virtual``, jitter on) with validation's own
run (``validate.measure_run``: the capacity lattice search): ``A``, a token budget of 2048,
and ``B``, 1024. The gain on the trace is B's capacity over A's on the trace itself (three
jitter seeds); each resampling scheme then gives ``--repeats`` paired runs, and their
t-interval (validation's, floor one lattice step) either excludes 0 or not.

    python benchmarks/trace_resample.py --seeds 10 --repeats 5

prints one JSON object: per scheme, the seeds whose interval excludes 0, the median interval
width, and how often each config held its SLOs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from autotune.config import StudyConfig, parse_config
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.tuning.measure.interval import paired_interval
from autotune.tuning.measure.validate import measure_run, single_run
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.workload.build import build_workload
from autotune.workload.core import Workload
from autotune.workload.rare_trace import rare_request_trace
from autotune.workload.resample import bootstrap, stratified_bootstrap

A = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 32768}
B = {"max_num_seqs": 256, "max_num_batched_tokens": 1024, "max_model_len": 32768}
SCHEMES = {"plain": bootstrap, "stratified": stratified_bootstrap}


def write_trace(path: Path, seed: int, n: int = 400, rate: float = 4.0) -> float:
    """A trace with one request 5x the 99th percentile of prompt + output; returns that p99."""
    tr = rare_request_trace(seed, n, rate)
    rows = ({"ts": tr.arrival[i], "in": tr.prompt[i], "out": tr.output[i]} for i in range(n))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tr.p99


def study_config(path: Path) -> StudyConfig:
    cols = {"timestamp": "ts", "input_length": "in", "output_length": "out"}
    text = json.dumps(
        {
            "name": "trace-resample",
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "hardware": "A100-80GB",
            "workload": {
                "source": "trace",
                "path": str(path),
                "columns": cols,
                "arrival": "trace",
                "num_prompts": 400,
            },
            "slo": {"p99_ttft_ms": 8000, "p99_tpot_ms": 100},
            "strategy": {"capacity_levels": 8, "capacity_high": 4.0},
        }
    )
    return parse_config(text, "trace-resample.yaml")


def capacity(cfg: StudyConfig, wl: Workload, args: dict[str, Any], jitter: int) -> float | None:
    runner = VirtualRunner(
        get_model(cfg.model.name),
        get_hardware(cfg.hardware),
        model_name="m",
        static_args={},
        seed=jitter,
        jitter_cv=cfg.worker.jitter_cv,
    )
    res = asyncio.run(measure_run(cfg, runner, wl, single_run(cfg, args), "x"))
    return res.capacity_scale if res.slo_held else None


def one_seed(seed: int, repeats: int, tmp: Path) -> dict[str, Any]:
    path = tmp / f"trace-{seed}.jsonl"
    write_trace(path, seed)
    cfg = study_config(path)
    wl = build_workload(cfg.workload)
    on_trace = [(capacity(cfg, wl, A, j), capacity(cfg, wl, B, j)) for j in range(3)]
    out: dict[str, Any] = {
        "seed": seed,
        "trace_gain_pct": [100 * (b / a - 1) if a and b else None for a, b in on_trace],
    }
    for name, resample in SCHEMES.items():
        gains, held = [], [0, 0]
        for r in range(repeats):
            sample = resample(wl, 1000 * seed + r)
            a, b = capacity(cfg, sample, A, r), capacity(cfg, sample, B, r)
            held[0] += a is not None
            held[1] += b is not None
            if a and b:
                gains.append(100 * (b / a - 1))
        iv = paired_interval(gains, 0.95, 100 * cfg.strategy.capacity_resolution) if gains else None
        out[name] = {
            "held": held,
            "interval": None if iv is None else [round(iv.low, 2), round(iv.high, 2)],
            "excludes_0": iv is not None and iv.low > 0,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows = [one_seed(s, opts.repeats, Path(d)) for s in range(opts.seeds)]
    summary: dict[str, Any] = {"seeds": rows}
    for name in SCHEMES:
        ivs = [r[name]["interval"] for r in rows if r[name]["interval"] is not None]
        summary[name] = {
            "excludes_0": sum(r[name]["excludes_0"] for r in rows),
            "median_width_pct": round(statistics.median(h - lo for lo, h in ivs), 2)
            if ivs
            else None,
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
