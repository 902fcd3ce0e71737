"""Where a study's replayed seconds go (docs/tuning.md#14-settling-losing-trials, "Where the
time goes").

Runs one study (default `configs/quickstart.yaml` with validation on) end to end into a
fresh SQLite file, once with the cost rules of docs/tuning.md (settling, inferred trials,
validation from each config's capacity) and once without them (the baseline: every trial
and validation run searched from the lattice's ends), and splits each run's stored search
levels:

- by trial outcome: the baseline, a trial that set a new best, one that tied the best so
  far, one below it measured in full (rules off), one settled (rules on), one inferred from a
  twin's levels without a worker (rules on: its levels are counted, never replayed);
- by level: the capacity point and the next point up (the edge every capacity figure
  needs), other feasible levels (replayed to their end), other infeasible levels (cut short
  by early stop).

Validation runs are counted whole (their levels are not stored). The figures are the
product's own counts (docs/cost.md); the check beside them is the sum of the stored levels'
replayed seconds, which the trials' counted replayed seconds exceed only by the baseline's
noise re-runs (counted, not stored as levels). ``floor_gpu_h`` (rules on) is a
perfect-foresight bound for the same trials, from the run's stored levels
(docs/cost.md#4-measured). Ends with one JSON line.
Usage: python benchmarks/replay_budget.py [--config configs/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
import yaml

from autotune.config import parse_config
from autotune.store import Store, TrialRecord
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.outcome import replay_seconds
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def outcome_of(t: TrialRecord, best: float | None) -> str:
    """The trial's outcome against the best capacity before it (``best``)."""
    if t.stage == "baseline":
        return "baseline"
    if t.inferred_from is not None:
        return "inferred"
    if t.state == "PRUNED":
        return "settled"
    cap = t.capacity_scale
    if cap is None or best is None:
        return "new best" if cap is not None else "infeasible"
    if cap > best * (1 + 1e-9):
        return "new best"
    if math.isclose(cap, best, rel_tol=1e-9):
        return "tie"
    return "below best"


def split(trials: list[TrialRecord]) -> dict[str, Any]:
    by_outcome: dict[str, float] = defaultdict(float)
    by_level: dict[str, float] = defaultdict(float)
    levels: dict[str, int] = defaultdict(int)
    best: float | None = None
    for t in sorted(trials, key=lambda t: t.optuna_trial_number):
        kind = outcome_of(t, best)
        cap = t.capacity_scale
        up = None
        if cap is not None:
            above = sorted(lv.scale for lv in t.levels if lv.scale > cap * (1 + 1e-9))
            up = above[0] if above else None
        for lv in t.levels:
            # an inferred trial's levels are its twin's: stored, never replayed
            s = replay_seconds(lv.metrics) if kind != "inferred" else 0.0
            by_outcome[kind] += s
            levels[kind] += 1
            if any(x is not None and math.isclose(lv.scale, x, rel_tol=1e-9) for x in (cap, up)):
                where = "edge"
            else:
                where = "other feasible" if lv.feasible else "other infeasible"
            by_level[where] += s
        if t.state == "COMPLETE" and t.feasible and cap is not None:
            best = cap if best is None else max(best, cap)
    return {"by_outcome": dict(by_outcome), "levels": dict(levels), "by_level": dict(by_level)}


def floor_s(trials: list[TrialRecord], runs: list[Any], startup_s: float) -> float | None:
    """A perfect-foresight bound (docs/cost.md#4-measured): the same starts, each trial
    replaying only its edge (the level at its capacity and the failed one above it) or, when
    it has no capacity (settled), its first level, and each validation run only two levels,
    as the cheapest two-level run did. None without a two-level run."""
    two = [r.replayed_s for r in runs if r.levels == 2 and r.replayed_s is not None]
    if not two:
        return None
    search = 0.0
    for t in trials:
        if t.inferred_from is not None:  # no worker, nothing replayed
            continue
        levels = sorted(t.levels, key=lambda lv: lv.level_index)
        cap = t.capacity_scale
        if cap is None:
            search += replay_seconds(levels[0].metrics) if levels else 0.0
            continue
        at = [lv for lv in levels if math.isclose(lv.scale, cap, rel_tol=1e-9)]
        up = sorted((lv for lv in levels if lv.scale > cap * (1 + 1e-9)), key=lambda lv: lv.scale)
        search += sum(replay_seconds(lv.metrics) for lv in (at[:1] + up[:1]))
    return startup_s + search + len(runs) * min(two)


def one(path: Path, rules: bool, folder: Path) -> dict[str, Any]:
    d = yaml.safe_load(path.read_text())
    st = d.setdefault("strategy", {})
    st["settle"] = rules
    st["infer"] = rules
    v = st.setdefault("validate", {})
    v["enabled"] = True
    v["from_capacity"] = rules
    text = yaml.safe_dump(d)
    cfg = parse_config(text, str(path))
    url = f"sqlite:///{folder / ('on' if rules else 'off')}.db"
    with Store.open(url) as store:
        create_study(cfg, text, store)
        run_study(cfg.name, store)
        trials = store.trials(cfg.name)
        runs = store.repeats(cfg.name)
    # the product's own counts (docs/cost.md#1-what-is-counted)
    search, validation, cost = study_cost(trials), study_cost((), runs), study_cost(trials, runs)
    stored = sum(
        replay_seconds(lv.metrics) for t in trials if t.inferred_from is None for lv in t.levels
    )
    out = split(trials)
    out.update(
        {
            "rules": rules,
            "trials_replayed_s": round(search.replayed_s, 1),
            "stored_levels_s": round(stored, 1),
            "validation_replayed_s": round(validation.replayed_s, 1),
            "validation_runs": cost.validation_runs,
            "worker_starts": cost.worker_starts,
            "gpu_h": round(cost.gpu_s / 3600, 2),
        }
    )
    floor = floor_s(trials, runs, cost.startup_s)
    out["floor_gpu_h"] = round(floor / 3600, 2) if floor is not None else None
    return out


def main() -> None:
    logging.getLogger("autotune").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        off, on = one(a.config, False, Path(tmp)), one(a.config, True, Path(tmp))
    print(f"{a.config.name}: replayed seconds of the search, by trial outcome (levels)")
    kinds = ["baseline", "new best", "tie", "below best", "settled", "inferred", "infeasible"]
    print(f"  {'':18s} {'rules off':>16s} {'rules on':>16s}")
    for k in kinds:
        cells = [
            f"{r['by_outcome'].get(k, 0.0):9.0f} ({r['levels'].get(k, 0):3d})" for r in (off, on)
        ]
        print(f"  {k:18s} {cells[0]:>16s} {cells[1]:>16s}")
    print("by level")
    for k in ("edge", "other feasible", "other infeasible"):
        print(f"  {k:18s} {off['by_level'].get(k, 0.0):16.0f} {on['by_level'].get(k, 0.0):16.0f}")
    for k in (
        "trials_replayed_s",
        "stored_levels_s",
        "validation_replayed_s",
        "gpu_h",
        "floor_gpu_h",
    ):
        print(f"  {k:22s} {off[k] if off[k] is not None else '-':>12} {on[k]:>16}")
    # the noise re-runs of the baseline (docs/tuning.md#7-validation) are counted, not stored
    assert all(r["stored_levels_s"] <= r["trials_replayed_s"] + 1 for r in (off, on))
    print(json.dumps({"bench": "replay_budget", "config": a.config.name, "off": off, "on": on}))


if __name__ == "__main__":
    main()
