"""The TP all-reduce constants, fitted on the published TP > 1 fit rows and checked on the
held-out ones (docs/simulator.md#3-step-cost-model, docs/sizing.md#8-tensor-parallel-constants).

The rows are ``benchmarks/data/sim_accuracy/rows.csv``'s with ``tp`` > 1, split as that
benchmark splits them (fixed before any fitting). All of them ran on NVLink (H100 SXM, A100
SXM): no published PCIe row exists, so the PCIe profiles' constants stay as they are. The fit
scans the all-reduce latency ``alpha`` and the achieved share of the link's per-direction
bandwidth (the profile's ``interconnect_bw`` times ``eta_link``) on a grid and keeps the pair
with the lowest mean absolute error, in log terms, over the fit rows' output throughput and
mean TPOT, mean ITL and mean end-to-end latency (each where the row publishes it). The
current constants, and the same simulator with no all-reduce cost at all, are printed beside
it: the baseline a fitted term has to beat; then each row's signed errors, current -> fitted.

Usage: python benchmarks/tp_link_fit.py [--figs output_tok_per_s,mean_tpot_ms,...].
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_accuracy import DATA, SEED, figures, model_of, read_rows, requests_of

from autotune.profiles.hardware import get_hardware
from autotune.sim import EngineArgs, simulate

ALPHAS_US = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
ETA_LINK = (0.05, 0.1, 0.25, 0.5, 1.0)
FIGS = ("output_tok_per_s", "mean_tpot_ms", "mean_itl_ms", "mean_e2e_ms")


def predict(row: Any, alpha: float, eta_link: float, tp_cost: bool = True) -> dict[str, float]:
    hw = get_hardware(row.gpu)
    hw = dataclasses.replace(
        hw,
        allreduce_latency=alpha if tp_cost else 0.0,
        interconnect_bw=hw.interconnect_bw * eta_link if tp_cost else 1e30,
    )
    args = EngineArgs(tensor_parallel_size=row.tp, **row.engine_args)
    res = simulate(
        model_of(row.model), hw, args, requests_of(row), seed=SEED, concurrency=row.concurrency
    )
    return figures(res)


def errors(
    rows: list[Any], preds: list[dict[str, float]], figs: tuple[str, ...]
) -> dict[str, float]:
    """Mean |log(pred / published)| over ``figs``, and per figure the mean absolute % error and
    the mean signed one (positive: the simulator's figure is higher)."""
    logs: list[float] = []
    out: dict[str, float] = {}
    for fig in figs:
        pct: list[float] = []
        for r, p in zip(rows, preds, strict=True):
            if fig in r.published and fig in p and p[fig] > 0:
                logs.append(abs(math.log(p[fig] / r.published[fig])))
                pct.append(100 * (p[fig] / r.published[fig] - 1))
        out[fig] = statistics.fmean(abs(x) for x in pct) if pct else float("nan")
        out[f"{fig}_signed"] = statistics.fmean(pct) if pct else float("nan")
    out["mean_abs_log"] = statistics.fmean(logs) if logs else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--figs", default=",".join(FIGS), help="the figures the fit weighs")
    figs = tuple(f.strip() for f in ap.parse_args().figs.split(","))
    rows = [r for r in read_rows(DATA / "rows.csv") if r.tp > 1 and r.input_len is not None]
    fit = [r for r in rows if r.split == "fit"]
    held = [r for r in rows if r.split != "fit"]
    base = get_hardware("H100-80GB").allreduce_latency
    print(f"TP > 1 rows: {len(fit)} fit ({', '.join(r.id for r in fit)})")
    print(f"             {len(held)} held out ({', '.join(r.id for r in held)})")
    grid: list[tuple[float, float, float]] = []
    for a in ALPHAS_US:
        for e in ETA_LINK:
            err = errors(fit, [predict(r, a * 1e-6, e) for r in fit], figs)["mean_abs_log"]
            grid.append((err, a, e))
            print(f"  alpha {a:>4.0f} us, eta_link {e:.2f}: fit mean |log err| {err:.4f}")
    best_err, best_a, best_e = min(grid)
    cands = {
        "current (alpha 10 us, eta_link 1)": (base, 1.0, True),
        f"fitted (alpha {best_a:g} us, eta_link {best_e:g})": (best_a * 1e-6, best_e, True),
        "no all-reduce cost": (0.0, 1.0, False),
    }
    result: dict[str, Any] = {}
    print(
        f"{'constants':<38} {'split':<9} {'out tok/s err %':>16} {'signed':>7} "
        f"{'TPOT err %':>11} {'signed':>7}"
    )
    for name, (a, e, on) in cands.items():
        for split, rs in (("fit", fit), ("held-out", held)):
            err = errors(rs, [predict(r, a, e, on) for r in rs], figs)
            print(
                f"{name:<38} {split:<9} {err['output_tok_per_s']:>16.1f} "
                f"{err['output_tok_per_s_signed']:>+7.1f} {err['mean_tpot_ms']:>11.1f} "
                f"{err['mean_tpot_ms_signed']:>+7.1f}"
            )
            result[f"{name} / {split}"] = {k: round(v, 2) for k, v in err.items()}
    # per row: where the constants pull (signed % error of each figure, current and fitted)
    print(f"{'row':<42} {'split':<8} " + " ".join(f"{f:>22}" for f in figs))
    for r in fit + held:
        cur, new = predict(r, base, 1.0), predict(r, best_a * 1e-6, best_e)
        cells = []
        for f in figs:
            if f in r.published and f in cur:
                pub = r.published[f]
                cells.append(
                    f"{100 * (cur[f] / pub - 1):+7.0f}% -> {100 * (new[f] / pub - 1):+7.0f}%"
                )
            else:
                cells.append(f"{'-':>22}")
        print(f"{r.id:<42} {r.split:<8} " + " ".join(f"{c:>22}" for c in cells))
    print(
        json.dumps(
            {
                "fit_rows": len(fit),
                "heldout_rows": len(held),
                "alpha_us": best_a,
                "eta_link": best_e,
                "fit_mean_abs_log": round(best_err, 4),
                "figs": list(figs),
                "errors": result,
            }
        )
    )


if __name__ == "__main__":
    main()
