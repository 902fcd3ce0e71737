"""The engine core's own step times on real vLLM (CPU) beside the twin's, load by load.

One server of one config (default ``max_num_seqs`` 32, ``max_num_batched_tokens`` 1,024,
``max_model_len`` 1,024, the tuning-size model; docs/vllm-cpu.md, section 8), calibrated with
``autotune calibrate``'s probe suite. Then bursts (8 and 32 sequences of one length, 32 and
96 of mixed lengths) and Poisson loads at 50 % and 85 % of the 96-request burst's capacity
run on the server, and the same requests on the twin and on the uncalibrated ``CPU``
profile, and on the twin once more with each request arriving when the client actually sent
it (``twin, as sent``: on this host the load generator shares the cores with the server and
falls behind its schedule; docs/calibrate.md#5-prediction-on-real-vllm). Per load: the engine
core's mean inter-token gap (the server's ``/metrics`` histogram; the simulated engine's),
its steps, its mean queue time, the client's output tok/s, and the client's send lag (sent
minus scheduled, p50 and p99).

Usage: python benchmarks/twin_loads.py [--venv PATH] [--max-num-seqs N] [--batched-tokens N]
Ends with one JSON line: per predictor, the gap's error per load and their median and max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_study import build_model, find_venv
from twin_fidelity import as_sent, engine_args, requests, scraped_run, serve

from autotune.calibrate.server_fit import calibrate_live
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import replay_level, twin_hardware
from autotune.telemetry.stats import HistogramDelta
from autotune.telemetry.summary import HISTOGRAMS
from autotune.workload.core import Workload

SHARES = (0.5, 0.85)
AS_SENT = "twin, as sent"  # the twin on the arrivals the client managed, not its schedule


def _mean(d: HistogramDelta | None, scale: float = 1e3) -> float | None:
    return d.sum / d.count * scale if d is not None and d.count else None


async def measure(url: str, wl: Workload) -> dict[str, Any]:
    res, before, after = await scraped_run(url, wl)
    if before is None or after is None:
        raise SystemExit(f"no /metrics page from {url}")
    d = {
        k: HistogramDelta.between(before.histograms.get(n), after.histograms[n])
        if n in after.histograms
        else None
        for k, n in HISTOGRAMS.items()
    }
    steps = d["iteration_tokens"]
    sent_at = {r.request_id: r.sent_at for r in res.records if r.sent_at is not None}
    lag = [1e3 * (r.sent_at - r.scheduled_at) for r in res.records if r.sent_at is not None]
    return {
        "gap_ms": _mean(d["itl"]),
        "steps": steps.count if steps else None,
        "queue_ms": _mean(d["queue_time"]),
        "tok_s": res.summary.get("output_throughput"),
        "lag_p50_ms": float(np.percentile(lag, 50)) if lag else None,
        "lag_p99_ms": float(np.percentile(lag, 99)) if lag else None,
        "sent": sent_at,
    }


def predicted(model: Any, hw: Any, ea: dict[str, Any], wl: Workload) -> dict[str, Any]:
    lvl = replay_level(model, hw, engine_args(ea), wl, seed=0, jitter_cv=0.0)
    h = lvl.telemetry.histograms
    steps = h.get("iteration_tokens")
    return {
        "gap_ms": _mean(h.get("itl")),
        "steps": steps.count if steps else None,
        "queue_ms": _mean(h.get("queue_time")),
        "tok_s": lvl.summary.get("output_throughput"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--batched-tokens", type=int, default=1024)
    a = ap.parse_args()
    ea = {
        "max_model_len": 1024,
        "max_num_seqs": a.max_num_seqs,
        "max_num_batched_tokens": a.batched_tokens,
    }
    venv, work, t0 = (
        find_venv(a.venv),
        Path(tempfile.mkdtemp(prefix="twinloads-")),
        time.monotonic(),
    )
    build_model(venv, work / "model")
    model, base = get_model(str(work / "model")), get_hardware("CPU")
    srv = serve(venv, work / "model", ea, work / "server")
    rows: dict[str, dict[str, Any]] = {}
    try:
        live = asyncio.run(calibrate_live(srv.url, model, base, engine_args(ea)))
        cal = live.calibration
        predictors = {"twin": twin_hardware(cal.spec(), "twin"), "uncalibrated": base}
        print(f"twin: fit's median error {cal.residual_pct}")
        print("   " + ", ".join(f"{s}.{n} {v:.4g}" for (s, n), v in cal.values.items()))
        loads = [
            ("8 x 64/256", requests(8, None, 1, lengths=(64, 256))),
            ("32 x 64/256", requests(32, None, 2, lengths=(64, 256))),
            ("32 x 256/64", requests(32, None, 3, lengths=(256, 64))),
            ("32 mixed", requests(32, None, 4)),
            ("96 mixed", requests(96, None, 5)),
        ]
        for label, wl in loads:
            rows[label] = {"real": asyncio.run(measure(srv.url, wl)), "wl": wl}
        burst = rows["96 mixed"]["real"]
        cap = burst["tok_s"] / statistics.mean(
            r.output_len for r in rows["96 mixed"]["wl"].requests
        )
        for share in SHARES:
            wl = requests(max(20, int(share * cap * 25)), share * cap, 6 + int(100 * share))
            rows[f"Poisson {share:.0%}"] = {"real": asyncio.run(measure(srv.url, wl)), "wl": wl}
    finally:
        srv.stop()
    errs: dict[str, dict[str, float]] = {p: {} for p in predictors}
    head = f"{'load':14s} {'predictor':20s} {'gap ms':>8s} {'steps':>7s} {'queue ms':>9s}"
    print(f"{head} {'tok/s':>7s}  send lag p50/p99 ms")
    for label, row in rows.items():
        real = row["real"]
        lag = f"{real['lag_p50_ms']:.0f}/{real['lag_p99_ms']:.0f}" if real["lag_p50_ms"] else "-"
        print(f"{label:14s} {'measured':20s} {_fmt(real)}  {lag}")
        runs = [(p, hw, row["wl"]) for p, hw in predictors.items()]
        runs.append((AS_SENT, predictors["twin"], as_sent(row["wl"], real["sent"])))
        for p, hw, wl in runs:
            got = predicted(model, hw, ea, wl)
            print(f"{'':14s} {p:20s} {_fmt(got)}")
            if real["gap_ms"] and got["gap_ms"]:
                errs.setdefault(p, {})[label] = round((got["gap_ms"] / real["gap_ms"] - 1) * 100, 1)
    summary = {
        p: {
            "gap_err_pct": e,
            "median_abs": round(statistics.median(abs(v) for v in e.values()), 1),
            "max_abs": max(abs(v) for v in e.values()),
        }
        for p, e in errs.items()
        if e
    }
    for p, s in summary.items():
        print(f"{p}: engine gap error median {s['median_abs']} %, max {s['max_abs']} %")
    wall = round(time.monotonic() - t0)
    print(json.dumps({"bench": "twin_loads", "engine_args": ea, "wall_s": wall, **summary}))


def _fmt(r: dict[str, Any]) -> str:
    def f(v: Any, spec: str) -> str:
        return format(v, spec) if v is not None else "-"

    return (
        f"{f(r['gap_ms'], '8.2f')} {f(r['steps'], '7.0f')} {f(r['queue_ms'], '9.1f')} "
        f"{f(r['tok_s'], '7.0f')}"
    )


if __name__ == "__main__":
    main()
