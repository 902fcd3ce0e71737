"""Refit the twin offline on what a ``twin_fidelity.py`` run measured, and report its held-out
errors again, once with the default fitted constants and once with more of them
(docs/calibrate.md#5-prediction-on-real-vllm).

A run of ``twin_fidelity.py`` keeps its work folder: the built model, the probe suite's
figures (``probes.json``) and every measured point with its requests' send times
(``measured.json``; the requests themselves follow from their seeds). This script fits the
twin to the same probes with ``DEFAULT_FITTED``, and again with ``DEFAULT_FITTED`` plus
``--also`` and without the probe figures ``--skip`` names (``burst:ttft``: the bursts' mean
TTFT), and prints ``twin_fidelity``'s report for each, on the same measurements: a paired
comparison of two fits, free of the spread between runs (each run's servers differ). The
first fit is the one the run made (the fit is deterministic), which the script checks.
``--quick``: the folder of a ``--quick`` run, refitted as that run fitted (from one start),
and the second fit cut to three iterations (CI checks the path, not that fit).
A constant that is 0 on the base profile is fitted from a start given with it
(``--also front_end.engine_share=1``: the API server sharing the engine core's CPU,
docs/simulator.md#34-the-api-server).

Usage: python benchmarks/twin_refit.py WORKDIR [--also cost.t_req NAME=START ...]
[--skip KIND:METRIC ...] [--quick]
Ends with one JSON line: each fit's constants and its ``twin_err_pct_max`` and medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import twin_fidelity as tf

from autotune.calibrate import DEFAULT_FITTED, fit_twin
from autotune.calibrate.observe import Observation
from autotune.calibrate.server_fit import suite_for
from autotune.calibrate.twin_fit import Constant
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import TwinFile, twin_constants, twin_hardware


def rows_of(kept: dict[str, Any], quick: bool) -> dict[str, Any]:
    """``twin_fidelity.main``'s rows from its ``measured.json``: the workloads rebuilt from
    their seeds (the order of ``labels`` there is the config's index)."""
    rows: dict[str, Any] = {}
    for i, (label, row) in enumerate(kept.items()):
        caps = row["caps"]
        loads = {}
        for share, v in row["loads"].items():
            wls = [
                tf.load_requests(i, float(share), v["rate"], k, quick)
                for k in range(len(v["runs"]))
            ]
            loads[share] = {
                "rate": v["rate"],
                "runs": v["runs"],
                "sent": list(zip(wls, v["sent"], strict=True)),
            }
        bursts = [
            (tf.burst_requests(i, k, quick), sent) for k, sent in enumerate(row["burst_sent"])
        ]
        for wl, sent in bursts + [x for v in loads.values() for x in v["sent"]]:
            if not set(sent) <= {r.request_id for r in wl.requests}:  # seeds out of step
                raise SystemExit(f"{label}: the rebuilt requests are not the ones the run sent")
        rows[label] = {
            "engine_args": row["engine_args"],
            "caps": caps,
            "bursts": bursts,
            "loads": loads,
            "capacity": {k: statistics.median(c[k] for c in caps) for k in caps[0]},
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--also", nargs="*", default=[], help="more constants, NAME[=START]")
    ap.add_argument("--skip", nargs="*", default=[], help="probe figures left out, KIND:METRIC")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    work = Path(a.workdir)
    for need in ("measured.json", "probes.json", "model"):
        if not (work / need).exists():
            ap.error(f"{work}: no {need}; give the work folder a twin_fidelity.py run printed")
    kept = json.loads((work / "measured.json").read_text())
    seen = [Observation(**o) for o in json.loads((work / "probes.json").read_text())]
    model, base = get_model(str(work / "model")), get_hardware("CPU")
    rows = rows_of(kept, a.quick)
    ea = tf.engine_args(rows["calibration"]["engine_args"])
    suite = suite_for(model, base, ea)
    held = [label for label in rows if label != "calibration"]
    known = twin_constants(base)
    extra: list[Constant] = []
    begin: dict[str, dict[str, float]] = {}  # the starts given, by twin file section
    for given in a.also:
        name, _, value = given.partition("=")
        c = cast(Constant, tuple(name.split(".", 1)))
        if c not in known or c in DEFAULT_FITTED:
            ap.error(f"--also {name}: not a constant of {base.name} left unfitted")
        try:
            at = float(value) if value else known[c]
        except ValueError:
            ap.error(f"--also {given}: the start after '=' is not a number")
        if not at > 0:  # the fit moves log(x)
            ap.error(f"--also {given}: 0 on {base.name}; give a start above 0 ({name}=1)")
        if value:
            begin.setdefault(c[0], {})[c[1]] = at
        extra.append(c)
    if not a.also and not a.skip:
        ap.error("give --also or --skip: the second fit's difference from the default")
    skipped = [tuple(given.split(":", 1)) for given in a.skip]
    if not all(len(k) == 2 for k in skipped):
        ap.error(f"--skip {' '.join(a.skip)}: each is KIND:METRIC (burst:ttft)")
    kind = {p.name: p.kind for p in suite}  # the suite's probes name the figures' probes
    kept_seen = [o for o in seen if (kind.get(o.probe), o.metric) not in skipped]
    if len(kept_seen) == len(seen) and skipped:
        ap.error(f"--skip {' '.join(a.skip)}: no probe figure is one of these")
    start = TwinFile(autotune_twin=1, base=base.name, **begin) if begin else None
    summary = {}
    variant = "+" + ",".join(a.also) if a.also else ""
    variant += "".join(f" -{k}" for k in a.skip)
    fits = (
        ("default", DEFAULT_FITTED, None, seen),
        (variant.strip(), DEFAULT_FITTED + tuple(extra), start, kept_seen),
    )
    starts = tf.fit_starts(a.quick)  # as the run fitted
    for name, fitted, fit_from, figures in fits:
        fit = partial(
            fit_twin, suite, figures, model, base, ea, fitted=fitted, starts=starts, start=fit_from
        )
        cal = fit(max_iter=3) if a.quick and name != "default" else fit()
        print(f"\n=== fit {name}: {cal.residual_pct}")
        for key, v in cal.values.items():
            print(f"  {'.'.join(key)} = {v:.4g} ± {cal.stderr.get(key, 0.0):.2g}")
        twin = twin_hardware(cal.spec(), "twin")
        out = tf.report(rows, model, base, twin, held, 0.0)
        summary[name] = {
            "constants": {f"{s}.{c}": v for (s, c), v in cal.values.items()},
            "residual_pct": cal.residual_pct,
            "figures": len(figures),  # the probe figures fitted
            **out,
        }
    print(json.dumps({"bench": "twin_refit", "workdir": str(work), "fits": summary}))


if __name__ == "__main__":
    main()
