"""Simulator speed: simulated seconds per wall second on a fixed workload.

Workload (issue #2): 1,000 requests, seeded lognormal lengths (mean prompt 512, mean output
256), all arriving at t = 0, Llama-3.1-8B on H100-80GB, default engine args. Measured in the
same run:
- ``engine``: autotune's simulator (V1 scheduler with the decode-mode fast path);
- ``plain_v1``: the same scheduler forced through the full V1 loop every step
  (``exact=True``), i.e. identical semantics without the fast path (results must match);
- ``naive``: a plain Python step loop over the same requests without bookkeeping (no KV
  cache, no preemption, no metrics): the baseline the issue names.

Target: ``sim_speed_ratio`` >= 1000. Ends with one JSON line.
Usage: python benchmarks/sim_speed.py [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.costs import CostModel
from autotune.sim.lengths import lognormal_requests
from autotune.sim.request import SimRequest
from autotune.sim.result import SimResult
from autotune.sim.virtual_loop import simulate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HW = "H100-80GB"


def naive_loop(reqs: list[SimRequest], cost: CostModel, mns: int, mnbt: int) -> float:
    """Continuous batching in its plainest form: every step walks every running request."""
    waiting = list(reqs)
    running: list[list[int]] = []  # [prompt, computed, outputs, max_tokens]
    now = 0.0
    while waiting or running:
        budget = mnbt
        tokens = samples = ctx = 0
        work = 0.0
        for r in running:
            n = min(r[0] + r[2] - r[1], budget)
            if n <= 0:
                continue
            budget -= n
            tokens += n
            if n == 1:
                ctx += r[1] + 1
            else:
                work += n * (r[1] + n / 2)
            r[1] += n
            if r[1] == r[0] + r[2]:
                r[2] += 1
                samples += 1
        while waiting and budget > 0 and len(running) < mns:
            q = waiting.pop(0)
            n = min(q.prompt_len, budget)
            budget -= n
            tokens += n
            work += n * n / 2
            r = [q.prompt_len, n, 0, q.output_len]
            if n == q.prompt_len:
                r[2] = 1
                samples += 1
            running.append(r)
        now += cost.step_time(tokens, samples, ctx, work, len(running))
        running = [r for r in running if r[2] < r[3]]
    return now


def timed(fn, repeat: int) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    best_wall, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if w < best_wall:
            best_wall, best_cpu = w, c
    return best_wall, best_cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (under a minute)")
    ap.add_argument("--profile", action="store_true", help="print where the engine's time goes")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    repeat = 3 if a.quick else 10
    model, hw = get_model(MODEL), get_hardware(HW)
    reqs = lognormal_requests(1000, 512, 256, seed=a.seed)
    args = EngineArgs()

    w_eng, c_eng, res = timed(lambda: simulate(model, hw, args, reqs, seed=a.seed), repeat)
    w_v1, c_v1, res_v1 = timed(
        lambda: simulate(model, hw, args, reqs, seed=a.seed, exact=True), max(1, repeat // 3)
    )
    assert isinstance(res, SimResult) and isinstance(res_v1, SimResult)
    identical = res.summary() == res_v1.summary() and all(
        np.array_equal(x.token_times, y.token_times)
        for x, y in zip(res.requests, res_v1.requests, strict=True)
    )
    resolved = args.resolve(model, hw)
    cost = CostModel.build(model, hw)
    w_nv, c_nv, sim_nv = timed(
        lambda: naive_loop(reqs, cost, resolved.max_num_seqs, resolved.max_num_batched_tokens),
        repeat,
    )
    s = res.summary()
    sim_s = float(s["duration_s"])
    tokens = sum(r.output_len for r in res.requests) + sum(r.prompt_len for r in res.requests)
    out_tokens = sum(r.output_len for r in res.requests)
    rows = [
        ("engine (fast path)", w_eng, c_eng, sim_s, int(s["num_steps"])),
        ("plain V1 loop (exact=True)", w_v1, c_v1, sim_s, res_v1.num_steps),
        ("naive step loop (no KV)", w_nv, c_nv, float(sim_nv), -1),  # type: ignore[arg-type]
    ]
    print(
        f"workload: 1000 requests, lognormal mean prompt 512 / output 256, all at t=0; "
        f"{MODEL} on {HW}, default args (mns={resolved.max_num_seqs}, "
        f"mnbt={resolved.max_num_batched_tokens}); KV {res.memory.kv_tokens:,} tokens; "
        f"{res.num_preemptions} preemptions"
    )
    hdr = ("implementation", "wall ms", "cpu ms", "sim s", "ratio", "steps")
    print(f"{hdr[0]:30} {hdr[1]:>9} {hdr[2]:>9} {hdr[3]:>8} {hdr[4]:>9} {hdr[5]:>6}")
    for name, w, c, sim, steps in rows:
        print(f"{name:30} {w * 1e3:9.2f} {c * 1e3:9.2f} {sim:8.2f} {sim / w:9.0f}x {steps:6}")
    print(f"fast path identical to plain V1 loop: {identical}")
    print(
        f"token events per CPU-second: {out_tokens / c_eng:,.0f} output tokens "
        f"({tokens / c_eng:,.0f} incl. prompt tokens)"
    )
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(simulate, model, hw, args, reqs, seed=a.seed)
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    print(
        json.dumps(
            {
                "bench": "sim_speed",
                "quick": a.quick,
                "sim_speed_ratio": round(sim_s / w_eng, 1),
                "plain_v1_loop_ratio": round(sim_s / w_v1, 1),
                "naive_loop_ratio": round(float(sim_nv) / w_nv, 1),  # type: ignore[arg-type]
                "wall_ms": round(w_eng * 1e3, 2),
                "cpu_ms": round(c_eng * 1e3, 2),
                "simulated_s": round(sim_s, 3),
                "steps": int(s["num_steps"]),
                "preemptions": res.num_preemptions,
                "output_token_events_per_cpu_s": round(out_tokens / c_eng),
                "fast_path_identical": identical,
                "target_ratio": 1000,
                "meets_target": sim_s / w_eng >= 1000,
            }
        )
    )


if __name__ == "__main__":
    main()
