"""``autotune size`` on the seed guide's RAG case, timed, with every row re-measured.

1. Runs ``autotune size --config configs/rag-chat.yaml --target-concurrency 300 --hardware
   H100-80GB,A100-80GB`` as the command line does (simulated, prices optional) and times it:
   the target is at most 15 minutes here (docs/sizing.md#7-the-seed-guides-rag-case).
2. Re-measures each usable row independently: its deployment of N replicas and of N - 1,
   ``--samples`` times each on fresh samples (seeds the size run never drew), pooled SLOs
   judged as the check judges them. The reported verdict is printed beside the share of
   re-measurements in which N met the SLOs and N - 1 did not.
3. The baseline: the seed guide's own single-server command
   (docs/method.md#81-online-serving-under-slos) for this workload on one H100 at the
   same 300 concurrent requests, on the same samples.

Usage: python benchmarks/size_rag.py [--samples 5] [--trials 12] [--hardware H100-80GB,A100-80GB]
Ends with one JSON line: ``wall_s``, ``rows`` (each with the reported and re-measured
figures), ``guide_single_server``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.config import load_config
from autotune.planning.deployment import deployment_runner
from autotune.planning.replicas import Target
from autotune.planning.size_run import replica_setup, size_deployment
from autotune.sim import EngineArgs, sim_engine_args
from autotune.store import Store
from autotune.tuning.search.plan import model_of

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "rag-chat.yaml"
# docs/method.md#81-online-serving-under-slos: the seed guide's command for this workload
GUIDE = EngineArgs(
    max_model_len=4096,
    max_num_seqs=320,
    max_num_batched_tokens=8192,
    enable_chunked_prefill=True,
    gpu_memory_utilization=0.9,
)
FRESH = 900_001  # re-measurement seeds: far from the size run's (the config's seed and up)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--hardware", default="H100-80GB,A100-80GB")
    ap.add_argument("--concurrency", type=int, default=300)
    a = ap.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_config(CONFIG)
    model = model_of(cfg)
    target = Target("concurrency", float(a.concurrency))
    hw = [h.strip() for h in a.hardware.split(",")]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Store.open(f"sqlite:///{tmp}/s.db") as store:
        report = size_deployment(cfg, target, hw, a.trials, {}, store)
    wall = time.perf_counter() - t0
    print(f"autotune size: {wall:.0f} s wall for {len(report.rows)} rows (target 900 s)")
    print(
        f"{'row':<18} {'N':>3} {'GPUs':>4} {'reported':<13} {'N met':>6} {'N-1 met':>7} "
        f"{'p99 TTFT rep/re':>16} {'p99 TPOT rep/re':>16}"
    )
    rows: list[dict[str, Any]] = []
    for r in report.rows:
        if not r.usable or r.engine_args is None or r.replicas is None:
            print(f"{r.hardware} TP{r.tensor_parallel_size:<8} n/a: {r.failure or r.check_text}")
            continue
        static = {"tensor_parallel_size": r.tensor_parallel_size}
        args = sim_engine_args(r.engine_args, static)
        met_n = met_below = 0
        ttft: list[float] = []
        tpot: list[float] = []
        for k in range(a.samples):
            setup = replica_setup(cfg, model, r.hardware, args)
            run = deployment_runner(replace(setup, seed=FRESH + 1000 * k), target)
            at = run(r.replicas)
            met_n += at.meets
            ttft.append(at.p99_ttft_ms or float("nan"))
            tpot.append(at.p99_tpot_ms or float("nan"))
            if r.replicas > 1:
                met_below += run(r.replicas - 1).meets
        name = f"{r.hardware} TP{r.tensor_parallel_size}"
        re_ttft, re_tpot = sorted(ttft)[len(ttft) // 2], sorted(tpot)[len(tpot) // 2]
        below = f"{met_below}/{a.samples}" if r.replicas > 1 else "-"  # no N - 1 to run
        print(
            f"{name:<18} {r.replicas:>3} {r.gpus:>4} {r.check or '-':<13} "
            f"{met_n}/{a.samples:<4} {below:<7} "
            f"{r.p99_ttft_ms or 0:>7,.0f}/{re_ttft:<8,.0f} "
            f"{r.p99_tpot_ms or 0:>7.1f}/{re_tpot:<8.1f}"
        )
        rows.append(
            {
                "row": name,
                "replicas": r.replicas,
                "gpus": r.gpus,
                "reported_check": r.check,
                "remeasured_n_met": met_n,
                "remeasured_n_minus_1_met": met_below if r.replicas > 1 else None,
                "samples": a.samples,
                "reported_p99_ttft_ms": r.p99_ttft_ms,
                "remeasured_p99_ttft_ms_median": re_ttft,
                "reported_p99_tpot_ms": r.p99_tpot_ms,
                "remeasured_p99_tpot_ms_median": re_tpot,
                "command": r.command,
            }
        )
    # the baseline: the guide's command, one H100, the whole target on it
    guide_met = 0
    guide_figs: list[tuple[float | None, float | None]] = []
    for k in range(a.samples):
        setup = replica_setup(cfg, model, "H100-80GB", GUIDE)
        run = deployment_runner(replace(setup, seed=FRESH + 1000 * k), target)
        d = run(1)
        guide_met += d.meets
        guide_figs.append((d.p99_ttft_ms, d.p99_tpot_ms))
    print(
        f"seed guide's single-server command on 1 H100 at {a.concurrency} concurrent: SLOs met "
        f"in {guide_met}/{a.samples} samples; p99 TTFT/TPOT per sample: "
        + ", ".join(f"{t or 0:,.0f}/{p or 0:.1f} ms" for t, p in guide_figs)
    )
    winner = report.winner
    print(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "target_concurrency": a.concurrency,
                "winner": None if winner is None else winner.command,
                "winner_gpus": None if winner is None else winner.gpus,
                "rows": rows,
                "guide_single_server": {
                    "samples": a.samples,
                    "met": guide_met,
                    "p99_ttft_ms": [t for t, _ in guide_figs],
                    "p99_tpot_ms": [p for _, p in guide_figs],
                },
            }
        )
    )


if __name__ == "__main__":
    main()
