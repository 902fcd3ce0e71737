"""Load generator overhead against the simulated server on this machine.

Fixed workload: 128-token prompts, 16-token outputs, Poisson arrivals, at 50 and 200 req/s
(500 req/s reported only). The simulated server (Llama-3.1-8B on H100-80GB, time scale 1) runs
in its own process, so the CPU time measured here is the client's. Baseline in the same run:
bare asyncio timers firing on the same schedule, no HTTP (the floor any asyncio client has).

Figures: scheduling lag p50/p99 (actual send - planned), client CPU seconds per 1,000
streamed chunks, and TTFT inflation = client TTFT - the server's own TTFT from
``--sim-request-log`` (targets: lag p99 <= 2 ms at 200 req/s; median inflation < 1 ms).
Ends with one JSON line. Usage: python benchmarks/loadgen_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.runner import run_load
from autotune.workload import arrivals
from autotune.workload.core import Workload, WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workload(n: int, rate: float, seed: int) -> Workload:
    t = arrivals.poisson(n, rate, seed)
    rng = np.random.default_rng(seed)
    reqs = [
        WorkloadRequest(
            128,
            16,
            tuple(int(x) for x in rng.integers(16, 30000, 128)),
            arrival=float(a),
            request_id=f"r{rate:g}-{i}",
        )
        for i, a in enumerate(t)
    ]
    return Workload(reqs, f"fixed 128/16 poisson {rate:g}")


async def bare_timers(times: np.ndarray) -> np.ndarray:
    """Baseline: one task per arrival sleeping until its time; lag = wake - planned."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    lags = np.empty(len(times))

    async def fire(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        lags[i] = loop.time() - (t0 + at)

    await asyncio.gather(*(fire(i, float(a)) for i, a in enumerate(times)))
    return lags


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    secs = 3.0 if a.quick else 10.0
    rates = (50.0, 200.0, 500.0)
    port = free_port()
    logdir = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    reqlog = logdir / "requests.jsonl"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "sim",
            "serve",
            MODEL,
            "--hardware",
            "H100-80GB",
            "--port",
            str(port),
            "--sim-startup-delay",
            "0",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "1024",
            "--sim-request-log",
            str(reqlog),
            "--sim-jitter-cv",
            "0",
            "--sim-stats-interval",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        rows = []
        for rate in rates:
            n = int(rate * secs)
            wl = workload(n, rate, seed=int(rate))
            times = wl.arrivals()
            assert times is not None
            base_lag = asyncio.run(bare_timers(times)) * 1e3
            reqlog.write_text("")
            c0 = time.process_time()
            res = asyncio.run(run_load(base, wl.requests, LoadOptions(model=MODEL, warmup=0)))
            cpu = time.process_time() - c0
            recs = [r for r in res.records if not r.warmup]
            lag = np.array([r.sent_at - r.scheduled_at for r in recs]) * 1e3
            chunks = sum(r.output_tokens for r in recs if r.success)
            truth = {d["request_id"]: d for d in map(json.loads, reqlog.read_text().splitlines())}
            infl = np.array(
                [
                    (r.ttft - (truth[r.request_id]["first_token"] - truth[r.request_id]["arrival"]))
                    * 1e3
                    for r in recs
                    if r.success and r.request_id in truth
                ]
            )
            rows.append(
                {
                    "rate": rate,
                    "requests": n,
                    "failed": res.summary["failed"],
                    "lag_p50_ms": float(np.percentile(lag, 50)),
                    "lag_p99_ms": float(np.percentile(lag, 99)),
                    "baseline_lag_p50_ms": float(np.percentile(base_lag, 50)),
                    "baseline_lag_p99_ms": float(np.percentile(base_lag, 99)),
                    "cpu_s_per_1000_chunks": cpu / max(chunks, 1) * 1000,
                    "ttft_inflation_median_ms": float(np.median(infl)) if infl.size else None,
                    "ttft_inflation_p99_ms": float(np.percentile(infl, 99)) if infl.size else None,
                }
            )
    finally:
        server.terminate()
        server.wait(10)
    print(
        "rate req/s | reqs | failed | lag p50/p99 ms | bare timers p50/p99 ms | "
        "client CPU s/1k chunks | TTFT inflation median/p99 ms"
    )
    for r in rows:
        print(
            f"{r['rate']:10.0f} | {r['requests']:4d} | {r['failed']:6d} | "
            f"{r['lag_p50_ms']:6.3f}/{r['lag_p99_ms']:6.3f} | "
            f"{r['baseline_lag_p50_ms']:6.3f}/{r['baseline_lag_p99_ms']:6.3f} | "
            f"{r['cpu_s_per_1000_chunks']:8.4f} | "
            f"{r['ttft_inflation_median_ms']:.3f}/{r['ttft_inflation_p99_ms']:.3f}"
        )
    by = {int(r["rate"]): r for r in rows}
    print(
        json.dumps(
            {
                "bench": "loadgen_overhead",
                "quick": a.quick,
                "lag_p99_ms_at_50rps": round(by[50]["lag_p99_ms"], 3),
                "lag_p99_ms_at_200rps": round(by[200]["lag_p99_ms"], 3),
                "lag_p99_ms_at_500rps": round(by[500]["lag_p99_ms"], 3),
                "baseline_lag_p99_ms_at_200rps": round(by[200]["baseline_lag_p99_ms"], 3),
                "cpu_s_per_1000_chunks_at_200rps": round(by[200]["cpu_s_per_1000_chunks"], 4),
                "ttft_inflation_median_ms_at_50rps": by[50]["ttft_inflation_median_ms"],
                "ttft_inflation_median_ms_at_200rps": by[200]["ttft_inflation_median_ms"],
                "targets": {"lag_p99_ms_at_200rps": 2.0, "ttft_inflation_median_ms": 1.0},
                "meets_lag_target": by[200]["lag_p99_ms"] <= 2.0,
                "meets_inflation_target": (by[200]["ttft_inflation_median_ms"] or 99) < 1.0,
            }
        )
    )


if __name__ == "__main__":
    main()
