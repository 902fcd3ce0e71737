"""A twin-guided study against a real-only study, both on real vLLM (CPU).

1. Builds the ``tuning`` size of the test model
   (docs/vllm-cpu.md#8-a-model-whose-step-time-grows-with-the-batch) and runs two
   slo-capacity studies (``benchmarks/real_study.py``'s, with 1,536 prompt and 64 output
   tokens, Poisson arrivals at 4 req/s, p99 TTFT 2 s, p99 TPOT 50 ms, loads 1 to 8 req/s,
   ``max_model_len`` 2048) on the venv's ``vllm serve``, one after the other, each into its
   own SQLite file:
   - ``twin`` (docs/tuning.md#15-the-twin-strategy), its twin starting from the uncalibrated
     ``CPU`` profile and fitted to the levels the study measures;
   - ``joint`` with ``--joint-trials`` trials (12: the issue's floor), the real-only study.
   Validation is off in both (each phase would re-measure its candidates on the same protocol,
   a cost both pay alike; on the simulator it raised the twin's ratio from 0.54 to 0.66,
   docs/tuning.md#15-the-twin-strategy): the GPU-seconds compared are the searches'.
2. Re-measures both recommendations ``--repeats`` times, interleaved (the order alternating),
   each run a capacity search of the study's protocol on a fresh workload sample and a fresh
   server (the validation phase's run, ``measure_run``), and compares them with a paired
   t-interval of the capacities (output tok/s at the capacity).

GPU-seconds are what the product counts (docs/cost.md): each worker's lifetime, starts
included; here the "GPU" is the host's CPU. The host's load average is printed: client and
server share two cores, and a loaded host moves every figure.

Usage: python benchmarks/twin_search_real.py [--quick] [--venv PATH] [--workdir DIR]
``--quick``: 3 joint trials, 1 twin trial, short levels, a coarse lattice, 1 repeat.
Ends with one JSON line: ``twin_real_trials``, ``twin_pct_of_real_best``,
``twin_gpu_seconds_ratio``, the paired interval and each study's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_study import LoadWatch, Plan, load1, quiet, study_dict, workspace
from twin_search import paired

from autotune.config import StudyConfig, parse_config
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.report.recommend import recommend
from autotune.report.twin_summary import twin_lines
from autotune.store import Store
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.validate import measure_run, single_run
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.study_attrs import stored_twin
from autotune.workload.build import workload_sample

# levels of 20 s and 60 requests (real_study's full plan: 30 s, 100): twenty-odd capacity
# searches must fit in an hour on this host; a lattice of 25 % steps from 1 to 8 req/s
FULL = Plan(
    n_trials=12, repeats=3, runs=0, min_level_s=20.0, min_level_requests=60, resolution=0.25
)
QUICK = Plan(n_trials=3, repeats=1, runs=0, min_level_s=5.0, min_level_requests=12, resolution=1.0)
INPUT_LEN, OUTPUT_LEN, TPOT_MS = 1536, 64, 50.0
SAMPLE_SEEDS = 5000  # the re-measurements' workload samples: never a study's own


def config(
    label: str, venv: Path, model: Path, work: Path, plan: Plan, twin_trials: int, screen: float
) -> tuple[StudyConfig, str]:
    d = study_dict(f"ts-{label}", venv, model, work / label / "workers", plan)
    d["hardware"] = "CPU"  # the twin's starting profile: the uncalibrated CPU backend
    # real_study's 128-token prompts leave the engine idle here (p99 TPOT 5.7 ms at 9.3 req/s,
    # where this host's client falls behind: docs/loadgen.md#5-client-limited-levels). Long
    # prompts make the prefills the cost: vLLM's defaults held p99 TPOT 44 ms at 4 req/s and
    # saturated at 6.6 req/s in a probe, so a 50-ms TPOT puts the capacities mid-lattice,
    # where chunking the prefills (max_num_batched_tokens) trades TPOT against throughput
    d["workload"].update(input_len=INPUT_LEN, output_len=OUTPUT_LEN)
    d["search"]["max_model_len"] = {"candidates": [2048]}
    d["slo"]["p99_tpot_ms"] = TPOT_MS
    st = d["strategy"]
    # 8 req/s, where the defaults saturate; --quick's coarse lattice would measure the
    # saturated 8 req/s, whose streams this host's client reads late (client-limited), so its
    # top is 6
    st["capacity_high"] = 2.0 if plan.resolution < 1 else 1.5
    st["validate"] = {"enabled": False}
    if label == "twin":
        st["name"] = "twin"
        st["twin"] = {"real_trials": twin_trials, "screen_cpu_s": screen}
    text = yaml.safe_dump(d)
    (work / f"{label}.yaml").write_text(text)
    return parse_config(text, str(work / f"{label}.yaml")), text


def study(cfg: StudyConfig, text: str, db: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    with Store.open(f"sqlite:///{db}") as store:
        if store.get_study(cfg.name) is None:  # else: a finished study of an earlier run
            create_study(cfg, text, store)
            run_study(cfg.name, store)
        every = store.trials(cfg.name)
        repeats = store.repeats(cfg.name)
        twin = twin_lines(*stored_twin(store, cfg.name), every)
    wall = time.perf_counter() - t0
    trials = [t for t in every if t.state in ("COMPLETE", "PRUNED")]
    cost = study_cost(every, repeats)
    rec = recommend(cfg, trials, repeats)
    return {
        "real_trials": len(every),
        "gpu_s": cost.gpu_s,
        "wall_s": wall,
        "engine_args": dict(rec.engine_args) if rec else None,
        "in_study": rec.trial.objective if rec else None,
        "trials": [
            (t.optuna_trial_number, t.state, dict(t.engine_args), t.objective) for t in every
        ],
        "twin_lines": twin,
    }


def remeasure(cfg: StudyConfig, args: dict[str, Any], k: int, work: Path, stride: int) -> float:
    """One validation run of ``args`` (a capacity search, the over-length limit left out) on
    sample ``k`` on a fresh server, over every ``stride``-th point of the study's lattice (2:
    the validation phase's run lattice, docs/tuning.md#7-validation; 1: the study's own):
    output tok/s at the capacity."""
    model, hw = get_model(cfg.model.name), get_hardware(cfg.hardware)
    wl, _ = workload_sample(cfg, SAMPLE_SEEDS + k, vocab_size=model.vocab_size)
    runner = make_runner(cfg, model, hw, work, check_lengths=False)
    run = single_run(cfg, args)
    res = asyncio.run(measure_run(cfg, runner, wl, run, f"re-{k}", stride=stride))
    return float(res.objective or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--venv", help="the vllm-cpu venv (default: scripts/vllm_cpu_env.sh)")
    ap.add_argument("--workdir", type=Path, help="keep the model, the studies and logs here")
    ap.add_argument("--joint-trials", type=int)
    ap.add_argument("--twin-trials", type=int, default=5)
    ap.add_argument("--screen-cpu-s", type=float, default=30.0)
    ap.add_argument("--stride", type=int, default=1, help="re-measure lattice: 1 study, 2 runs")
    a = ap.parse_args()
    quiet()
    plan = QUICK if a.quick else FULL
    if a.joint_trials:
        plan = dataclasses.replace(plan, n_trials=a.joint_trials)
    twin_trials = 1 if a.quick else a.twin_trials
    venv, work, model, info = workspace(a.venv, a.workdir, "tsr-")
    loads = {"before": load1()}
    watch = LoadWatch()
    t_all = time.perf_counter()
    out: dict[str, Any] = {}
    cfgs: dict[str, StudyConfig] = {}
    for label in ("twin", "joint"):
        cfg, text = config(label, venv, model, work, plan, twin_trials, a.screen_cpu_s)
        cfgs[label] = cfg
        out[label] = study(cfg, text, work / f"{label}.db")
        s = out[label]
        print(
            f"{label}: {s['real_trials']} real trials, {s['gpu_s']:,.0f} GPU-s, "
            f"{s['wall_s']:.0f} s wall; recommends {s['engine_args']} ({s['in_study']})"
        )
        for n, state, ea, obj in s["trials"]:
            print(f"    trial {n} {state:8s} {ea} -> {obj}")
        for line in s["twin_lines"]:
            print(f"    {line}")
    for label in out:
        out[label]["remeasured"] = []
    for k in range(plan.repeats):
        for label in ("twin", "joint") if k % 2 == 0 else ("joint", "twin"):
            ea = out[label]["engine_args"]
            v = remeasure(cfgs["joint"], ea, k, work / "re" / label, a.stride) if ea else 0.0
            out[label]["remeasured"].append(v)
            print(f"re-measure {k} {label}: {v:,.1f} output tok/s (load {load1():.2f})")
    loads.update(watch.stop())
    loads["after"] = load1()
    t, j = out["twin"], out["joint"]
    m, lo, hi = paired(t["remeasured"], j["remeasured"])
    rel = 100.0 * statistics.mean(t["remeasured"]) / statistics.mean(j["remeasured"])
    ratio = t["gpu_s"] / j["gpu_s"] if j["gpu_s"] else float("nan")
    print(
        f"model: {info['params']:,} parameters; twin {t['real_trials']} real trials, "
        f"{t['gpu_s']:,.0f} GPU-s; joint {j['real_trials']}, {j['gpu_s']:,.0f} GPU-s "
        f"(ratio {ratio:.2f}); twin re-measured at {rel:.1f} % of joint's, paired "
        f"{m:+.1f} % [{lo:+.1f}, {hi:+.1f}]"
    )
    print(
        f"load average (1 min): before {loads['before']:.2f}, during {loads['during_mean']:.2f}"
        f" (up to {loads['during_max']:.2f}), after {loads['after']:.2f}"
    )
    print(
        json.dumps(
            {
                "bench": "twin_search_real",
                "quick": a.quick,
                "twin_real_trials": t["real_trials"],
                "joint_real_trials": j["real_trials"],
                "twin_pct_of_real_best": round(rel, 2),
                "paired_pct": [round(x, 2) for x in (m, lo, hi)],
                "twin_gpu_seconds_ratio": round(ratio, 3),
                "total_wall_s": round(time.perf_counter() - t_all, 1),
                "load_avg": {k: round(x, 2) for k, x in loads.items()},
                "studies": out,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
