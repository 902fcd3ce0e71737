"""Per-scenario check of one strategy's recommendations, quicker than the full
``benchmarks/tuning_quality.py`` (no early-stop comparison, no interval re-measurement).

For each scenario and seed, run a study exactly as ``tuning_quality.py`` does
(``tuning_quality.scenario_study``), then measure under the ground-truth protocol the
search's own pick (its best trial) and, with ``--val``, the study's final recommendation after
its validation phase; print each as % of the cached best known config
(``benchmarks/data/tuning_quality_truth.json``), with the validation verdict and intervals.

Usage: python benchmarks/search_check.py SCENARIO [SCENARIO ...] | --broad [--seeds 3] [--val]
  [--repeats R] [--top-k K] [--strategy staged] [--trials 20] [--jobs 2] [-v]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from truth import ALL_SCENARIOS, BROAD, TruthCache, pct
from tuning_quality import _quiet, scenario_study, strategy_config

from autotune.report.recommend import recommend
from autotune.tuning.measure.interval import summary_of
from autotune.tuning.measure.protocol import GROUND_TRUTH, measure_config


def one(task: tuple[str, int, bool, str, int, dict[str, Any]]) -> dict[str, Any]:
    _quiet()
    name, seed, val, strategy, n_trials, validate = task
    st = strategy_config(strategy, n_trials)
    st["validate"] = validate if val else {"enabled": False}
    cfg, trials, reps, wall = scenario_study(name, st, seed)
    out: dict[str, Any] = {"name": name, "seed": seed, "wall_s": wall}
    out["trials"] = [(t.stage, t.engine_args, round(t.objective or 0, 1)) for t in trials]
    picks = {"search": recommend(cfg, trials), "validated": recommend(cfg, trials, reps)}
    summary = summary_of(cfg, reps, trials) if val else None
    if summary is not None:
        out["verdict"] = summary.verdict
        out["intervals"] = [
            None if c.interval is None else [round(c.interval.low, 2), round(c.interval.high, 2)]
            for c in summary.candidates
        ]
    for kind, rec in picks.items():
        if rec is None or (kind == "validated" and not val):
            continue
        m = asyncio.run(measure_config(cfg, rec.engine_args, GROUND_TRUTH))
        out[kind] = {"engine_args": rec.engine_args, "objective": m.objective}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # no ``choices`` here: argparse checks an empty ``nargs="*"`` list against them too
    ap.add_argument("names", nargs="*", help=f"scenarios: {', '.join(sorted(ALL_SCENARIOS))}")
    ap.add_argument("--broad", action="store_true", help="the eleven BROAD scenarios (truth.py)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--val", action="store_true", help="run the validation phase too")
    ap.add_argument("--strategy", default="staged")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--repeats", type=int, help="strategy.validate.repeats (default: the product's)"
    )
    ap.add_argument("--top-k", type=int, help="strategy.validate.top_k (default: the product's)")
    ap.add_argument("-v", action="store_true", help="print every trial")
    a = ap.parse_args()
    names = list(BROAD) if a.broad else a.names
    if not names:
        ap.error("name a scenario or pass --broad")
    unknown = [n for n in names if n not in ALL_SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    cache = TruthCache()
    validate = {k: v for k, v in (("repeats", a.repeats), ("top_k", a.top_k)) if v is not None}
    tasks = [(n, s, a.val, a.strategy, a.trials, validate) for n in names for s in range(a.seeds)]
    with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
        results = pool.map(one, tasks, chunksize=1)
    figs: dict[str, list[float]] = {"search": [], "validated": []}
    for r in results:
        entry = cache.scenario(r["name"])
        if entry is None:
            sys.exit(f"no ground truth for {r['name']}: run tuning_quality.py --truth-only")
        best = entry["best_known"]["objective"]
        cells = []
        for kind in figs:
            if kind in r:
                p = pct(r[kind]["objective"], best)
                figs[kind].append(p)
                cells.append(f"{kind} {p:6.2f}")
        print(
            f"{r['name']:22s} seed {r['seed']}: {'  '.join(cells)}  {r.get('verdict', '')} "
            f"{r.get('intervals', '')}  {r['wall_s']:.0f} s  {r['search']['engine_args']}"
        )
        if a.v:
            for t in r["trials"]:
                print("    ", t)
    out: dict[str, Any] = {"bench": "search_check", "strategy": a.strategy, "trials": a.trials}
    out["validate"] = validate
    for kind, ps in figs.items():
        if ps:
            out[f"median_pct_of_best_{kind}"] = round(statistics.median(ps), 2)
            out[f"worst_pct_of_best_{kind}"] = round(min(ps), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
