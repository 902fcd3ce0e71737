"""The quickstart study, timed, and whether the gain it reports survives re-measurement.

For each seed (workload and sampler seeds change together; the simulator's step jitter is
on), run `configs/quickstart.yaml` (or `--config`) end to end (create + run) into a fresh
SQLite file and record its wall time and the recommendation's gain over the baseline trial
(vLLM's defaults, measured in the same study with the same protocol). The recommendation and
the baseline are then re-measured with the ground-truth protocol (jitter off, 0.5 % capacity
resolution, no hint, the study's workload sample; docs/tuning.md#5-re-measurement-and-ground-truth):
the reported gain must lie within 2 percentage points of the re-measured one. Targets: under
60 s per study; at least 10 % gain in every seed (`min_gain_pct`); gain error <= 2 pp; the
JSON export under 200 KB (beside the `--full` export, docs/report.md#5-machine-readable-output).
Ends with one JSON line.
Usage: python benchmarks/quickstart.py [--quick] [--seeds 0 1 2] [--config configs/rag-chat.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
import yaml

from autotune.config import StudyConfig, parse_config
from autotune.report.recommend import recommend
from autotune.report.study_export import export_json
from autotune.store import Store
from autotune.tuning.measure.protocol import GROUND_TRUTH, measure_config
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def with_seed(path: Path, seed: int) -> tuple[StudyConfig, str]:
    d = yaml.safe_load(path.read_text())
    d["seed"] = seed
    d["workload"]["seed"] = seed
    text = yaml.safe_dump(d)
    return parse_config(text, str(path)), text


def remeasure(cfg: StudyConfig, engine_args: dict[str, Any]) -> float:
    """Output tok/s at capacity under the ground-truth protocol."""
    return asyncio.run(measure_config(cfg, engine_args, GROUND_TRUTH)).objective


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="same runs (they take seconds)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=CONFIG)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.WARNING)
    rows = []
    for seed in a.seeds:
        cfg, text = with_seed(a.config, seed)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            store = Store.open(f"sqlite:///{tmp}/q.db")
            create_study(cfg, text, store)
            run_study(cfg.name, store)
            wall = time.perf_counter() - t0
            trials = store.trials(cfg.name)
            rec = recommend(cfg, trials)
            study = store.get_study(cfg.name)
            store.close()
        assert study is not None
        export_kb = len(export_json(study, trials).encode()) / 1e3
        full_kb = len(export_json(study, trials, full=True).encode()) / 1e3
        assert rec is not None and rec.baseline is not None
        base_re = remeasure(cfg, rec.baseline.engine_args)
        best_re = remeasure(cfg, rec.engine_args)
        rows.append(
            {
                "seed": seed,
                "wall_s": wall,
                "trials": len(trials),
                "baseline_tok_s": rec.baseline.objective,
                "best_tok_s": rec.trial.objective,
                "gain_pct": rec.gain_pct,
                "remeasured_baseline_tok_s": base_re,
                "remeasured_best_tok_s": best_re,
                "remeasured_gain_pct": 100 * (best_re / base_re - 1) if base_re else None,
                "best_engine_args": rec.engine_args,
                "export_kb": export_kb,
                "export_full_kb": full_kb,
            }
        )
    print(
        "seed | wall s | trials | baseline tok/s | best tok/s | gain % | re-measured gain % "
        "| export KB (--full)"
    )
    for r in rows:
        rg = r["remeasured_gain_pct"]
        print(
            f"{r['seed']:4d} | {r['wall_s']:6.1f} | {r['trials']:6d} | "
            f"{r['baseline_tok_s']:14,.0f} | {r['best_tok_s']:10,.0f} | "
            f"{r['gain_pct']:6.1f} | {rg:6.1f} | {r['export_kb']:,.0f} ({r['export_full_kb']:,.0f})"
            if rg is not None
            else "n/a"
        )
        print(f"       best: {r['best_engine_args']}")
    gains = [r["gain_pct"] for r in rows]
    regains = [r["remeasured_gain_pct"] for r in rows if r["remeasured_gain_pct"] is not None]
    errs = [
        abs(r["gain_pct"] - r["remeasured_gain_pct"])
        for r in rows
        if r["remeasured_gain_pct"] is not None
    ]
    max_err = max(errs) if errs else None
    print(
        json.dumps(
            {
                "bench": "quickstart",
                "config": str(a.config),
                "quick": a.quick,
                "seeds": a.seeds,
                "max_wall_s": round(max(r["wall_s"] for r in rows), 2),
                "min_gain_pct": round(min(gains), 2),
                "gains_pct": [round(g, 2) for g in gains],
                "min_remeasured_gain_pct": round(min(regains), 2) if regains else None,
                "remeasured_gains_pct": [round(g, 2) for g in regains],
                "max_gain_error_pp": round(max_err, 2) if max_err is not None else None,
                "max_export_kb": round(max(r["export_kb"] for r in rows), 1),
                "max_export_full_kb": round(max(r["export_full_kb"] for r in rows), 1),
                "targets": {
                    "max_wall_s": 60,
                    "min_gain_pct": 10,
                    "max_gain_error_pp": 2,
                    "max_export_kb": 200,
                },
                "meets_targets": max(r["wall_s"] for r in rows) < 60
                and min(gains) >= 10
                and max_err is not None
                and max_err <= 2
                and max(r["export_kb"] for r in rows) < 200,
            }
        )
    )


if __name__ == "__main__":
    main()
