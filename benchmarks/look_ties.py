"""Same-session A/B of one of the validation look's rules (docs/tuning.md#7-validation,
"Twins at the look" and "No baseline to beat"): each scenario's default (staged) study with
validation on, once as shipped and once with the rule off, and what each cost and
recommended. ``--rule tied`` (default) turns off the tie rule (``early_look.tied`` answering
False); ``--rule no-baseline`` the look at a ``no-baseline`` verdict
(``early_look.baseline_never_serves`` answering False: the look never stops there, as
before).

The study's search is the same in both (the rule acts only at the look), so a difference is
the validation phase's alone: its runs, its GPU-hours and its recommendation.

Usage: python benchmarks/look_ties.py [SCENARIO ...] [--broad] [--seeds 3] [--jobs 2]
  [--rule tied|no-baseline] (default: the benchmark's eight scenarios). Ends with one JSON
  line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from truth import ALL_SCENARIOS, BROAD, SCENARIOS
from tuning_quality import _quiet, costed_study, strategy_config

import autotune.tuning.measure.early_look as early_look
from autotune.report.recommend import recommend
from autotune.tuning.measure.cost import study_cost

# the function each rule's "off" side patches to answer False
RULES = {"tied": "tied", "no-baseline": "baseline_never_serves"}


def one(task: tuple[str, int, bool, str]) -> dict[str, Any]:
    name, seed, rule, which = task
    _quiet()
    if not rule:
        # the baseline: the look without the rule (a fresh process per task, so the patch
        # never leaks into a run with the rule on)
        setattr(early_look, RULES[which], lambda *a, **k: False)
    cfg, trials, reps, wall, cost, _ = costed_study(name, strategy_config("staged", 20), seed)
    rec = recommend(cfg, trials, reps)
    return {
        "name": name,
        "seed": seed,
        "rule": rule,
        "gpu_hours": round(cost.gpu_hours, 3),
        "validation_gpu_hours": round(study_cost((), reps).gpu_hours, 3),
        "runs": len(reps),
        "chosen": None if rec is None else rec.engine_args,
        "keep": None if rec is None else rec.keep,
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"scenarios: {', '.join(sorted(ALL_SCENARIOS))}")
    ap.add_argument("--broad", action="store_true", help="the eleven BROAD scenarios (truth.py)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rule", choices=sorted(RULES), default="tied")
    a = ap.parse_args()
    names = a.names or list(BROAD if a.broad else SCENARIOS)
    unknown = [n for n in names if n not in ALL_SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    tasks = [(n, s, r, a.rule) for n in names for s in range(a.seeds) for r in (True, False)]
    with multiprocessing.get_context("fork").Pool(a.jobs, maxtasksperchild=1) as pool:
        out = pool.map(one, tasks, chunksize=1)
    changed = other_pick = 0
    for on, off in zip(out[::2], out[1::2], strict=True):
        same = (on["chosen"], on["runs"]) == (off["chosen"], off["runs"])
        changed += not same
        same_pick = (on["chosen"], on["keep"]) == (off["chosen"], off["keep"])
        other_pick += not same_pick
        pick = "same pick" if same_pick else "PICK"
        print(
            f"{on['name']:26s} seed {on['seed']}: rule on {on['gpu_hours']:6.2f} GPU-h "
            f"(validation {on['validation_gpu_hours']:5.2f}, {on['runs']} runs) | off "
            f"{off['gpu_hours']:6.2f} (validation {off['validation_gpu_hours']:5.2f}, "
            f"{off['runs']} runs) | {'same' if same else 'CHANGED'}, {pick}"
        )
    sums = {
        k: round(sum(o["gpu_hours"] for o in out if o["rule"] is v), 2)
        for k, v in (("on", True), ("off", False))
    }
    print(f"GPU-hours over the {len(out) // 2} studies: rule on {sums['on']}, off {sums['off']}")
    print(
        json.dumps(
            {
                "bench": "look_ties",
                "rule": a.rule,
                "studies": len(out) // 2,
                "changed": changed,
                "other_pick": other_pick,
                "gpu_hours": sums,
            }
        )
    )


if __name__ == "__main__":
    main()
