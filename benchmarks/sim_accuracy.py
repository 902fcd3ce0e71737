"""The simulator against measurements others published (benchmarks/data/sim_accuracy/).

Replays every row of ``benchmarks/data/sim_accuracy/rows.csv`` on the in-process simulator
(``autotune.sim.simulate``: the row's model, GPU, tensor parallelism, engine args, request
count, mean lengths and arrival pattern) and prints, per row, the predicted figure beside the
published one with the signed error: request and output-token throughput, mean and p99 TTFT,
mean TPOT, mean ITL and mean end-to-end latency. Then the mean absolute percentage error
(MAPE) per metric for the held-out and the fit rows (the split in the data folder's
README.md, fixed before any fitting), burst rows apart (all requests at once: mostly
queueing), and beside each the constant-ratio baseline: the error left if the simulator's
figure were scaled by one factor fitted on the fit rows (the median published/predicted
ratio).

What the replay approximates (the rows do not publish it): lengths are lognormal around the
published means (sigma 0.5; a ``random`` run's fixed lengths are kept), the ShareGPT texts'
prefixes are not shared, and a paced row replays its rate for ``PACED_S`` seconds of constant
arrivals instead of the source's 600-second stage. A row without a GPU profile or without
lengths is listed as skipped. Models without a built-in profile come from the
``config.json`` files beside the rows (their published architecture).

Usage: python benchmarks/sim_accuracy.py [--rows PATH]. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.errors import ProfileError, SimStartupError
from autotune.profiles.hardware import HardwareProfile, get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, SimRequest, SimResult, lognormal_requests, simulate
from autotune.sim.accuracy import ACCURACY_FILE, AccuracyGroup, AccuracyTable, gpu_class
from autotune.sim.version import engine_fingerprint

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "sim_accuracy"
PACKAGE_TABLE = ROOT / "autotune" / "sim" / ACCURACY_FILE
PACED_S = 120.0  # seconds of constant arrivals a paced row replays
SEED = 0
# published column -> what the replay measured
METRICS = (
    "req_per_s",
    "output_tok_per_s",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2e_ms",
)
# the groups of metrics: throughput, TTFT, TPOT/ITL, end to end
GROUPS = {
    "throughput": ("req_per_s", "output_tok_per_s"),
    "ttft": ("mean_ttft_ms",),
    "tpot": ("mean_tpot_ms", "mean_itl_ms"),
    "e2e": ("mean_e2e_ms",),
}


@dataclass(frozen=True)
class Row:
    """One published run, as ``rows.csv`` holds it."""

    id: str
    gpu: str
    tp: int
    model: str
    dataset: str
    input_len: float | None
    output_len: float | None
    prompts: int | None
    rate: float | None  # None: no pacing
    concurrency: int | None
    kind: str
    engine_args: dict[str, Any]
    confidence: str
    split: str
    published: dict[str, float]

    @classmethod
    def of(cls, d: dict[str, str]) -> Row:
        def num(k: str) -> float | None:
            return float(d[k]) if d[k] not in ("", "inf") else None

        return cls(
            id=d["id"],
            gpu=d["gpu"],
            tp=int(d["tp"]),
            model=d["model"],
            dataset=d["dataset"],
            input_len=num("input_len"),
            output_len=num("output_len"),
            prompts=int(d["prompts"]) if d["prompts"] else None,
            rate=num("rate"),
            concurrency=int(d["concurrency"]) if d["concurrency"] else None,
            kind=d["kind"],
            engine_args=json.loads(d["engine_args"]) if d["engine_args"] else {},
            confidence=d["confidence"],
            split=d["split"],
            published={k: float(d[k]) for k in METRICS if d[k]},
        )


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as f:
        return [Row.of(d) for d in csv.DictReader(f)]


def model_of(name: str) -> Any:
    """The built-in profile, else the ``config.json`` beside the rows."""
    try:
        return get_model(name)
    except ProfileError:
        return get_model(str(DATA / "models" / name.split("/")[-1]))


def requests_of(row: Row) -> list[SimRequest]:
    """The row's requests: its count (a paced row: PACED_S seconds of its rate), its mean
    lengths; all at once, paced at its rate (constant arrivals) or Poisson at its rate."""
    assert row.input_len is not None and row.output_len is not None
    n = row.prompts or 0
    if row.kind == "paced":
        assert row.rate is not None
        n = int(PACED_S * row.rate)
    if row.dataset == "random":
        reqs = [
            SimRequest(int(row.input_len), int(row.output_len), request_id=f"req-{i}")
            for i in range(n)
        ]
    else:
        # a Poisson row's arrivals are drawn at its rate (seeded), as its client drew them
        rate = row.rate if row.kind == "poisson" else None
        drawn = lognormal_requests(n, row.input_len, row.output_len, seed=SEED, rate=rate)
        # the draw's own means miss the published ones by a few per cent at 100 requests
        prompts = with_mean([q.prompt_len for q in drawn], row.input_len)
        outputs = with_mean([q.output_len for q in drawn], row.output_len)
        reqs = [
            SimRequest(p, o, q.arrival, request_id=q.request_id)
            for p, o, q in zip(prompts, outputs, drawn, strict=True)
        ]
    if row.kind == "paced":
        assert row.rate is not None
        reqs = [
            SimRequest(q.prompt_len, q.output_len, i / row.rate, request_id=q.request_id)
            for i, q in enumerate(reqs)
        ]
    return reqs


def with_mean(values: Sequence[int], mean: float) -> list[int]:
    """``values`` scaled so that their total is ``round(len · mean)`` (each at least 1)."""
    if not values:
        return []
    k = mean * len(values) / sum(values)
    out = [max(1, round(v * k)) for v in values]
    out[out.index(max(out))] += round(mean * len(values)) - sum(out)
    return out


def figures(res: SimResult) -> dict[str, float]:
    """The replay's figures in the published columns' units."""
    done = [r for r in res.requests if not r.rejected and not r.warmup]
    s = res.summary()
    gaps = np.concatenate([np.diff(r.token_times) for r in done if len(r.token_times) > 1])
    return {
        "req_per_s": float(s["request_throughput"]),
        "output_tok_per_s": float(s["output_throughput"]),
        "mean_ttft_ms": float(s["mean_ttft_ms"]),
        "p99_ttft_ms": float(s["p99_ttft_ms"]),
        "mean_tpot_ms": float(s["mean_tpot_ms"]),
        "mean_itl_ms": 1e3 * float(gaps.mean()) if len(gaps) else 0.0,
        "mean_e2e_ms": 1e3 * statistics.fmean(r.e2e for r in done),
    }


def replay(
    row: Row, adjust: Callable[[HardwareProfile], HardwareProfile] | None = None
) -> dict[str, float] | str:
    """The row's predicted figures, or why it was skipped; ``adjust`` changes the row's GPU
    profile first (benchmarks/sim_accuracy_bounds.py sweeps a constant with it)."""
    if row.input_len is None or row.output_len is None:
        return "lengths not published"
    try:
        hw = get_hardware(row.gpu)
    except ProfileError:
        return f"no GPU profile for {row.gpu}"
    if adjust is not None:
        hw = adjust(hw)
    args = EngineArgs(tensor_parallel_size=row.tp, **row.engine_args)
    try:
        res = simulate(
            model_of(row.model), hw, args, requests_of(row), seed=SEED, concurrency=row.concurrency
        )
    except SimStartupError as exc:
        # the published run started: a simulator that refuses it is wrong about memory
        return f"the simulator refuses to start it ({str(exc).split('. ')[0]})"
    return figures(res)


def err_pct(pred: float, pub: float) -> float:
    return 100.0 * (pred / pub - 1.0)


def mape(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error of (predicted, published) pairs."""
    if not pairs:
        return None
    return statistics.fmean(abs(err_pct(p, q)) for p, q in pairs)


def group_figures(
    rows: Sequence[Row], pred: dict[str, dict[str, float]], ratio: dict[str, float]
) -> dict[str, Any]:
    """Per metric group: MAPE, the constant-ratio baseline's, and the pairs behind them."""
    out: dict[str, Any] = {"rows": len(rows)}
    for g, metrics in GROUPS.items():
        pairs = [
            (pred[r.id][m], r.published[m], ratio.get(m, 1.0))
            for r in rows
            for m in metrics
            if m in r.published and r.id in pred
        ]
        out[f"{g}_mape"] = mape([(p, q) for p, q, _ in pairs])
        out[f"{g}_baseline_mape"] = mape([(k * p, q) for p, q, k in pairs])
        out[f"{g}_pairs"] = len(pairs)
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DATA / "rows.csv")
    ap.add_argument(
        "--write",
        action="store_true",
        help=f"write the held-out errors to {PACKAGE_TABLE.relative_to(ROOT)} (package data)",
    )
    a = ap.parse_args()
    rows = read_rows(a.rows)
    pred: dict[str, dict[str, float]] = {}
    skipped: dict[str, str] = {}
    print(f"{'row':42s} {'metric':17s} {'published':>11s} {'simulated':>11s} {'error':>8s}")
    for row in rows:
        got = replay(row)
        if isinstance(got, str):
            skipped[row.id] = got
            print(f"{row.id:42s} skipped: {got}")
            continue
        pred[row.id] = got
        flags = [row.split, row.kind] + ([row.confidence] if row.confidence != "full" else [])
        tag = f"[{', '.join(flags)}]"
        print(f"{row.id:42s} {tag}")
        for m in METRICS:
            if m in row.published:
                pub, p = row.published[m], got[m]
                print(f"{'':42s} {m:17s} {pub:11.2f} {p:11.2f} {err_pct(p, pub):+7.1f}%")
    # the constant-ratio baseline: one factor per metric, fitted on the fit rows
    fit = [r for r in rows if r.split == "fit" and r.id in pred]
    ratio = {}
    for m in METRICS:
        rs = [r.published[m] / pred[r.id][m] for r in fit if m in r.published and pred[r.id][m]]
        if rs:
            ratio[m] = statistics.median(rs)
    out: dict[str, Any] = {"bench": "sim_accuracy", "rows": len(rows), "skipped": skipped}
    print("\nMAPE % (constant-ratio baseline in brackets; pairs)")
    for split in ("heldout", "fit"):
        for burst in (False, True):
            sel = [r for r in rows if r.split == split and (r.kind == "burst") == burst]
            g = group_figures(sel, pred, ratio)
            name = f"{split}{'_burst' if burst else ''}"
            cells = [
                f"{k} {_r(g[f'{k}_mape'])} ({_r(g[f'{k}_baseline_mape'])}; {g[f'{k}_pairs']})"
                for k in GROUPS
            ]
            print(f"  {name:14s} rows {g['rows']:2d}: " + ", ".join(cells))
            out[f"{name}_rows"] = g["rows"]
            for k in GROUPS:
                out[f"{name}_{k}_mape"] = _r(g[f"{k}_mape"])
                out[f"{name}_{k}_baseline_mape"] = _r(g[f"{k}_baseline_mape"])
    out["constant_ratio"] = {m: round(v, 3) for m, v in ratio.items()}
    if a.write:
        table = shipped_table(rows, pred)
        PACKAGE_TABLE.write_text(json.dumps(table.to_dict(), indent=2) + "\n")
        print(f"wrote {PACKAGE_TABLE.relative_to(ROOT)}")
    print(json.dumps(out))


def shipped_table(rows: Sequence[Row], pred: dict[str, dict[str, float]]) -> AccuracyTable:
    """The held-out errors per GPU class and overall, steady and burst apart: what a study
    planned on the simulator states (autotune.sim.accuracy)."""
    held = [r for r in rows if r.split == "heldout" and r.id in pred]
    groups = []
    for cls in [*sorted({gpu_class(r.gpu) for r in held}), None]:
        for bursts in (False, True):
            sel = [
                r
                for r in held
                if (r.kind == "burst") == bursts and (cls is None or gpu_class(r.gpu) == cls)
            ]
            if not sel:
                continue
            g = group_figures(sel, pred, {})
            groups.append(
                AccuracyGroup(
                    cls,
                    bursts,
                    len(sel),
                    _r(g["throughput_mape"]),
                    _r(g["ttft_mape"]),
                    _r(g["tpot_mape"]),
                    _r(g["e2e_mape"]),
                )
            )
    return AccuracyTable(engine_fingerprint(), tuple(groups))


if __name__ == "__main__":
    main()
