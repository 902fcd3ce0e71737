"""A twin-guided study against a real-only study, on the simulator's scenarios.

For each scenario of ``benchmarks/truth.py`` and seed: the "real" worker is ``sim-virtual``
on the scenario's GPU profile (jitter on); the twin starts from that profile with its
constants deliberately wrong (weights read at 0.6x the efficiency, 3x the step overhead, a
third of the API server's intake cost, twice its streaming cost), so the study has to
calibrate it from the levels it measures (docs/tuning.md#15-the-twin-strategy). The
real-only study is ``joint`` with ``--joint-trials`` trials (12: the issue's floor).

Both final recommendations (the validation phase's) are re-measured three times, interleaved,
on fresh seeds with the study's protocol (jitter on), and compared by a paired t-interval;
and once with the ground-truth protocol, as a percentage of the scenario's cached ground truth.
GPU-seconds are what the product counts (docs/cost.md): starts, levels, noise re-runs and
validation runs of every worker.

Usage: python benchmarks/twin_search.py [--quick] [--seeds N] [--jobs N] [--screen-cpu-s S]
Ends with one JSON line: ``twin_real_trials`` (max over studies, the baseline included),
``twin_pct_of_real_best`` (median and worst: the twin's re-measured mean over the joint's),
``twin_gpu_seconds_ratio`` (median and max; the search alone beside it) and each study's
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from truth import QUICK, SCENARIOS, TruthCache, pct, scenario_config
from tuning_quality import _quiet, costed_study

from autotune.report.recommend import recommend
from autotune.sim import TwinFile, dump_twin, hardware_of, twin_constants
from autotune.tuning.measure.protocol import GROUND_TRUTH, measure_config, study_protocol
from autotune.tuning.measure.tdist import t_quantile

REPEATS = 3
# how wrong the twin starts, per constant (a factor on the profile's own value)
WRONG = {
    ("hardware", "eta_bw"): 0.6,
    ("cost", "t_fixed"): 3.0,
    ("front_end", "per_request"): 1 / 3,
    ("front_end", "per_output_token"): 2.0,
}


def wrong_twin(hardware: str, folder: Path) -> str:
    """A profile file for ``hardware`` with the WRONG factors applied; returns file:PATH."""
    now = twin_constants(hardware_of(hardware))
    sections: dict[str, dict[str, float]] = {"hardware": {}, "cost": {}, "front_end": {}}
    for (section, name), f in WRONG.items():
        sections[section][name] = now[(section, name)] * f
    spec = TwinFile(autotune_twin=1, base=hardware, **sections)  # type: ignore[arg-type]
    path = folder / f"wrong-{hardware}.yaml"
    path.write_text(dump_twin(spec))
    return f"file:{path}"


def one(task: tuple[str, int, int, float]) -> dict[str, Any]:
    _quiet()
    name, seed, joint_trials, screen_cpu_s = task
    cfg0, _ = scenario_config(name)
    with tempfile.TemporaryDirectory() as tmp:
        twin_st = {
            "name": "twin",
            "twin": {
                "profile": wrong_twin(cfg0.hardware, Path(tmp)),
                "real_trials": 5,
                "screen_cpu_s": screen_cpu_s,
            },
        }
        out: dict[str, Any] = {"scenario": name, "seed": seed}
        joint_st = {"name": "joint", "n_trials": joint_trials}
        for label, st in (("twin", twin_st), ("joint", joint_st)):
            cfg, trials, repeats, wall, cost, _ = costed_study(name, st, seed)
            rec = recommend(cfg, trials, repeats)
            out[label] = {
                "real_trials": len(trials),
                "gpu_s": cost.gpu_s,
                "validation_gpu_s": cost.validation_gpu_s,
                "wall_s": wall,
                "engine_args": rec.engine_args if rec else None,
                "in_study": rec.trial.objective if rec else None,
            }
    # the finals re-measured: interleaved fresh seeds, the study's protocol (jitter on)
    proto = study_protocol(cfg0)
    for label in ("twin", "joint"):
        out[label]["remeasured"] = []
    for k in range(REPEATS):
        for label in ("twin", "joint") if k % 2 == 0 else ("joint", "twin"):
            ea = out[label]["engine_args"]
            m = asyncio.run(measure_config(cfg0, ea, proto, seed=1000 + k)) if ea else None
            out[label]["remeasured"].append(m.objective if m else 0.0)
    for label in ("twin", "joint"):
        ea = out[label]["engine_args"]
        gt = asyncio.run(measure_config(cfg0, ea, GROUND_TRUTH)).objective if ea else 0.0
        out[label]["ground_truth"] = gt
    return out


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean of a - b in % of mean b, and its 95 % t-interval."""
    d = [100.0 * (x - y) / statistics.mean(b) for x, y in zip(a, b, strict=True)]
    m = statistics.mean(d)
    h = t_quantile(0.95, len(d) - 1) * statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0
    return m, m - h, m + h


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--joint-trials", type=int, default=12)
    ap.add_argument("--screen-cpu-s", type=float, default=60.0)
    a = ap.parse_args()
    names = list(QUICK if a.quick else SCENARIOS)
    tasks = [(n, s, a.joint_trials, a.screen_cpu_s) for n in names for s in range(a.seeds)]
    with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
        rows = pool.map(one, tasks)
    cache = TruthCache()
    print(
        f"{'scenario':<24}{'seed':>5}{'twin trials':>12}{'joint':>7}{'twin GPU-s':>12}"
        f"{'joint GPU-s':>12}{'ratio':>7}{'twin/joint %':>13}{'paired 95% CI':>20}"
        f"{'twin % truth':>13}{'joint % truth':>14}"
    )
    summary = []
    for r in rows:
        t, j = r["twin"], r["joint"]
        m, lo, hi = paired(t["remeasured"], j["remeasured"])
        entry = cache.scenario(r["scenario"])
        known = max(t["ground_truth"], j["ground_truth"])
        best = max(entry["best_known"]["objective"], known) if entry else known
        ratio = t["gpu_s"] / j["gpu_s"] if j["gpu_s"] else float("nan")
        rel = 100.0 * statistics.mean(t["remeasured"]) / statistics.mean(j["remeasured"])
        print(
            f"{r['scenario']:<24}{r['seed']:>5}{t['real_trials']:>12}{j['real_trials']:>7}"
            f"{t['gpu_s']:>12,.0f}{j['gpu_s']:>12,.0f}{ratio:>7.2f}{rel:>13.1f}"
            f"{f'{m:+.1f} [{lo:+.1f}, {hi:+.1f}]':>20}"
            f"{pct(t['ground_truth'], best):>13.1f}{pct(j['ground_truth'], best):>14.1f}"
        )
        ts, js = t["gpu_s"] - t["validation_gpu_s"], j["gpu_s"] - j["validation_gpu_s"]
        search_ratio = ts / js if js else float("nan")
        print(
            f"{'':<29}search only: twin {ts:,.0f} GPU-s, joint {js:,.0f} ({search_ratio:.2f}); "
            f"validation twin {t['validation_gpu_s']:,.0f}, joint {j['validation_gpu_s']:,.0f}; "
            f"twin wall {t['wall_s']:.0f} s (its rounds' CPU), joint {j['wall_s']:.0f} s"
        )
        summary.append(
            r
            | {"paired_pct": [m, lo, hi], "ratio": ratio, "rel": rel, "search_ratio": search_ratio}
        )
    out = {
        "twin_real_trials": max(s["twin"]["real_trials"] for s in summary),
        "twin_pct_of_real_best": {
            "median": round(statistics.median(s["rel"] for s in summary), 2),
            "worst": round(min(s["rel"] for s in summary), 2),
        },
        "twin_gpu_seconds_ratio": {
            "median": round(statistics.median(s["ratio"] for s in summary), 3),
            "max": round(max(s["ratio"] for s in summary), 3),
        },
        # the search alone (the validation phase, the same protocol for both, left out)
        "twin_search_gpu_seconds_ratio": {
            "median": round(statistics.median(s["search_ratio"] for s in summary), 3),
            "max": round(max(s["search_ratio"] for s in summary), 3),
        },
        "paired_interval_below_zero": sum(1 for s in summary if s["paired_pct"][2] < 0),
        "studies": summary,
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
