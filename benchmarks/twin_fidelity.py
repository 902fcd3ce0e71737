"""How well a calibrated twin predicts real vLLM (CPU) on configs it was not fitted on.

1. Builds the ``tuning`` size of the test model (``--quick``: the tiny one; docs/vllm-cpu.md,
   section 8) and serves it with the calibration config.
2. ``autotune calibrate``'s probe suite against that server, and the fit (base profile ``CPU``).
3. For the calibration config and each held-out config (other ``max_num_seqs``,
   ``max_num_batched_tokens`` and ``max_model_len``), ``--repeats`` rounds, each on a fresh
   server of its own, the configs interleaved (round 2 in reverse order): its capacity
   measured with a burst (every request at t = 0; output tok/s and req/s at saturation),
   then Poisson loads at 50 % and 85 % of the first round's burst capacity, their order
   alternating between rounds (50, 85 / 85, 50). The calibration runs on the first
   round's server of the calibration config. Each run has prompts of its
   own (the same lengths and arrivals): vLLM caches prefixes, and a repeated prompt would
   fake a fast prefill. The same requests and engine args are replayed on three
   predictors: the calibrated twin, the uncalibrated simulator (``CPU``) and a constant (the
   calibration config's own median figures at the same load share). The simulated ones
   replay each repeat with its requests arriving when the client sent them (``as_sent``;
   on this host the client falls behind its schedule under load and bunches its sends) and
   predict the median of the repeats' figures.
4. Errors are against the median of the repeats; a point's noise band is its repeats' spread
   ((max - min) / median). Throughput errors are on the capacities (a load below capacity
   serves what is offered, which any predictor gets right), and the capacity's band is its
   bursts' spread (``capacity`` in ``noise_band_by_metric_pct``); the loads' output tok/s are
   printed beside them. Beside the client's TTFT and TPOT, ``engine_itl_ms``: the mean gap
   between tokens by the engine core's own clock (the server's ``/metrics`` histogram, the
   simulated engine's for the predictors), which the API server's and the client's delays on
   this host's shared cores do not reach.

``--quick`` checks only that the path completes (CI's real-vLLM group): the tiny model, one
held-out config (8 sequences), one round, two-second loads, the two servers started together,
and the fit run from its start alone (``fit_starts``;
``benchmarks/twin_refit.py --quick`` refits the same way). ``--model DIR`` serves a model
folder already built, linked into the work folder, instead of building one (CI passes the
tiny model its real-vLLM session has built for the other tests).

Usage: python benchmarks/twin_fidelity.py [--quick] [--venv PATH] [--model DIR] [--repeats N]
[--calibrate-on N]
Ends with one JSON line: ``heldout_throughput_err_pct_max``, ``heldout_p50_ttft_err_pct_max``,
``heldout_p50_tpot_err_pct_max``, ``heldout_engine_itl_err_pct_max``, ``noise_band_pct``,
``constant_predictor_err_pct_max`` and the per-predictor, per-point figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_study import ENV, Server, build_model, find_venv

from autotune.calibrate import FIT_STARTS
from autotune.calibrate.live import engine_delta
from autotune.calibrate.server_fit import calibrate_live, write_profile
from autotune.config import parse_config
from autotune.loadgen import LoadOptions, LoadResult, make_session, probe_server, run_load
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, replay_level, twin_hardware
from autotune.telemetry.scrape import Snapshot, scrape
from autotune.workload.core import Workload, WorkloadRequest

KV_BYTES = 268435456
CALIBRATION = {"max_model_len": 1024, "max_num_seqs": 16, "max_num_batched_tokens": 2048}
HELD_OUT = [
    {"max_model_len": 1024, "max_num_seqs": 2, "max_num_batched_tokens": 2048},
    {"max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": 1024},
    {"max_model_len": 1024, "max_num_seqs": 8, "max_num_batched_tokens": 4096},
    {"max_model_len": 1024, "max_num_seqs": 32, "max_num_batched_tokens": 1024},
    {"max_model_len": 1024, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
    {"max_model_len": 512, "max_num_seqs": 16, "max_num_batched_tokens": 512},
]
SHARES = (0.5, 0.85)
HEADLINE = ("capacity", "median_ttft_ms", "median_tpot_ms", "engine_itl_ms")
METRICS = (
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "engine_itl_ms",
)


def requests(
    n: int,
    rate: float | None,
    seed: int,
    run: int = 0,
    *,
    lengths: tuple[int, int] | None = None,
) -> Workload:
    """``n`` requests of 64-256 prompt and 32-96 output tokens (or of ``lengths``, prompt and
    output, each), Poisson at ``rate`` (None: all at t = 0). ``run`` changes only the request
    ids, from which the prompts derive: a repeat has the same lengths and arrivals and no
    prefix-cache hit on an earlier run."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n) if rate else np.zeros(n)
    t = np.cumsum(gaps) - (gaps[0] if rate else 0.0)
    out = []
    for i in range(n):
        p, o = lengths or (int(rng.integers(64, 257)), int(rng.integers(32, 97)))
        out.append(WorkloadRequest(p, o, arrival=float(t[i]), request_id=f"r{seed}-{run}-{i}"))
    return Workload(out, "twin fidelity")


def fit_starts(quick: bool) -> int:
    """The fit's runs: ``--quick``'s one, from the base profile (about a third of the default's
    CPU: the path is checked, not the fit), else the default."""
    return 1 if quick else FIT_STARTS


def burst_requests(i: int, k: int, quick: bool) -> Workload:
    """Config ``i``'s capacity burst in round ``k``."""
    return requests(16 if quick else 96, None, 100 + i, run=k)


def load_requests(i: int, share: float, rate: float, k: int, quick: bool) -> Workload:
    """Config ``i``'s Poisson load at ``share`` of its capacity (``rate``) in round ``k``:
    25 s of it, 2 s under ``--quick``, at least 20 requests."""
    n = max(20, int(rate * (2.0 if quick else 25.0)))
    return requests(n, rate, 200 + i * 10 + SHARES.index(share), run=k)


def servers(
    venv: Path, model: Path, plan: list[tuple[int, dict[str, Any], int]], work: Path, ahead: bool
) -> Iterator[tuple[int, dict[str, Any], int, Server]]:
    """A fresh server for each ``(config, engine args, round)`` of ``plan``, in order,
    stopped when the caller moves on. ``ahead`` starts each next server together with the
    one before and stops each while the next is measured (``--quick``, whose figures are not
    judged: two servers on this host's two cores disturb each other's timings); otherwise a
    server starts after the one before stopped."""
    pool = ThreadPoolExecutor(2)

    def start(j: int) -> Future[Server] | None:
        if j >= len(plan):
            return None
        i, ea, k = plan[j]
        return pool.submit(serve, venv, model, ea, work / f"w{i}-{k}")

    nxt = start(0)
    stopping: list[Future[None]] = []
    try:
        for j, (i, ea, k) in enumerate(plan):
            # ahead, both at once: a vLLM start is CPU work, and one started after the first
            # served slowed its probes (21 s against 6) and the run (97 s against 85)
            now, nxt = nxt, start(j + 1) if ahead else None
            assert now is not None
            srv = now.result()
            try:
                yield i, ea, k, srv
            finally:
                if ahead:  # stopped while the next one is measured
                    stopping.append(pool.submit(srv.stop))
                else:
                    srv.stop()
            nxt = nxt or start(j + 1)
    finally:  # the caller stopped early: the server started ahead goes too
        if nxt is not None:
            nxt.result().stop()
        for f in stopping:
            f.result()
        pool.shutdown()


def engine_args(ea: dict[str, Any]) -> EngineArgs:
    """The engine args every server here runs with: ``ea`` and the fixed KV size, eager."""
    return EngineArgs(**ea, kv_cache_memory_bytes=KV_BYTES, enforce_eager=True)


def serve(venv: Path, model: Path, ea: dict[str, Any], workdir: Path) -> Server:
    argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", "m"]
    for k, v in ea.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(KV_BYTES), "--port", "0"]
    cfg = parse_config(
        f"name: f\nmodel: {{name: {model}}}\nhardware: CPU\n"
        "workload: {source: synthetic, rate: 1}\nworker: {kind: vllm}\nslo: {p99_ttft_ms: 1000}\n",
        "twin_fidelity.yaml",
    )
    return Server(argv, cfg, workdir)


async def scraped_run(
    url: str, wl: Workload
) -> tuple[LoadResult, Snapshot | None, Snapshot | None]:
    """Run ``wl`` against ``url``; the load's result and the ``/metrics`` pages before and
    after it (the latter half a second after the last request: vLLM records a step's stats
    just after handing its outputs out)."""
    info = await probe_server(url)
    metrics = url.rstrip("/") + "/metrics"
    async with make_session() as session:
        before = await scrape(session, metrics, 10.0)
        tokens = await server_tokens(session, info)
        sent = await prepare_for_server(
            wl, tokens, endpoint="completions", vocab_size=info.vocab_size or 2000
        )
        res = await run_load(
            url, sent.requests, LoadOptions(model=info.model_id, drain_timeout=300)
        )
        await asyncio.sleep(0.5)
        return res, before, await scrape(session, metrics, 10.0)


async def measure(url: str, wl: Workload) -> tuple[dict[str, float], dict[str, float]]:
    """The run's figures, and when the client sent each request (by id)."""
    res, before, after = await scraped_run(url, wl)
    engine = engine_delta(before, after)
    gaps = engine.itl_sum / engine.itl_count if engine and engine.itl_count else 0.0
    s = {**res.summary, "engine_itl_ms": 1e3 * gaps}
    figures = {k: float(s.get(k) or 0.0) for k in (*METRICS, "request_throughput", "completed")}
    return figures, {r.request_id: r.sent_at for r in res.records if r.sent_at is not None}


def as_sent(wl: Workload, sent: dict[str, float]) -> Workload:
    """``wl`` with each request arriving when the client actually sent it. On this host the
    load generator shares the cores with the server and falls behind its schedule under load,
    bunching its sends (docs/calibrate.md#5-prediction-on-real-vllm): the server saw these
    arrivals, and the client's TTFT runs from them."""
    t0 = min(sent.values(), default=0.0)
    return Workload(
        [
            WorkloadRequest(
                r.prompt_len, r.output_len, arrival=sent[r.request_id] - t0, request_id=r.request_id
            )
            for r in wl.requests
            if r.request_id in sent
        ],
        wl.source,
    )


def predicted(model: Any, hw: Any, ea: dict[str, Any], wl: Workload) -> dict[str, float]:
    lvl = replay_level(model, hw, engine_args(ea), wl, seed=0, jitter_cv=0.0)
    itl = lvl.telemetry.histograms.get("itl")
    s = {**lvl.summary, "engine_itl_ms": 1e3 * itl.sum / itl.count if itl and itl.count else 0.0}
    return {k: float(s.get(k) or 0.0) for k in (*METRICS, "request_throughput")}


def predicted_as_sent(
    model: Any, hw: Any, ea: dict[str, Any], runs: list[tuple[Workload, dict[str, float]]]
) -> dict[str, float]:
    """The median over the repeats of each figure predicted for the arrivals that repeat's
    server saw (``as_sent``), as the measured figure is the median of the repeats."""
    # a repeat that sent nothing (every request failed) has no arrivals: its schedule stands
    preds = [predicted(model, hw, ea, as_sent(wl, sent) if sent else wl) for wl, sent in runs]
    return {k: statistics.median(p[k] for p in preds) for k in preds[0]}


def err(p: float, m: float) -> float:
    return abs(p / m - 1.0) * 100.0 if m > 0 else float("nan")


def spread(vals: list[float]) -> float | None:
    """A point's noise band: its repeats' (max - min) / median, %; None without two repeats
    or with a median of 0."""
    med = statistics.median(vals) if vals else 0.0
    return (max(vals) - min(vals)) / med * 100 if len(vals) > 1 and med > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--venv")
    ap.add_argument("--model", help="a built model folder to serve (default: build one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--calibrate-on",
        type=int,
        default=0,
        choices=range(len(HELD_OUT) + 1),
        help="calibrate on held-out config N (1-6) instead, the default calibration config "
        "taking its place among the held-out",
    )
    a = ap.parse_args()
    venv = find_venv(a.venv)
    calibration, held = CALIBRATION, list(HELD_OUT)
    if a.calibrate_on:
        calibration, held[a.calibrate_on - 1] = held[a.calibrate_on - 1], calibration
    # --quick: the 8-sequence config, whose loads run in a few seconds (2 sequences take 26)
    held = [held[2]] if a.quick else held
    repeats = 1 if a.quick else a.repeats
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="twinfid-"))
    model_dir = work / "model"
    if a.model:  # linked, so the work folder holds it as benchmarks/twin_refit.py reads it
        built = Path(a.model).resolve()
        if not (built / "config.json").is_file():
            ap.error(f"--model {a.model}: no config.json there; give a built model folder")
        model_dir.symlink_to(built, target_is_directory=True)
    elif a.quick:
        import subprocess

        subprocess.run(
            [str(venv / "bin/python"), "tests/real_vllm/make_tiny_model.py", str(model_dir)],
            check=True,
            capture_output=True,
            env={**ENV, "PATH": "/usr/bin:/bin", "HF_HOME": str(work / "hf")},
            cwd=Path(__file__).resolve().parents[1],
        )
    else:
        build_model(venv, model_dir)
    model, base = get_model(str(model_dir)), get_hardware("CPU")
    configs = [calibration, *held]
    labels = ["calibration", *(f"held-out {i}" for i in range(1, len(configs)))]
    rows: dict[str, Any] = {
        label: {"engine_args": ea, "caps": [], "bursts": [], "loads": {}}
        for label, ea in zip(labels, configs, strict=True)
    }
    twin = None
    # A repeat is a fresh server, the configs interleaved (the order reversed every other
    # round, so a drift of the host lands on every config alike): a re-measurement of a
    # config starts its own server, and fresh servers of one config differ by more than
    # one server's repeats (docs/calibrate.md#5-prediction-on-real-vllm).
    order = list(enumerate(configs))
    plan = [(i, ea, k) for k in range(repeats) for i, ea in (order[:: 1 if k % 2 == 0 else -1])]
    for i, ea, k, srv in servers(venv, model_dir, plan, work, ahead=a.quick):
        label, row = labels[i], rows[labels[i]]
        if twin is None and i == 0:
            live = asyncio.run(
                calibrate_live(srv.url, model, base, engine_args(ea), starts=fit_starts(a.quick))
            )
            twin = twin_hardware(live.calibration.spec(), "twin")
            cal = live.calibration
            saved = write_profile(live.spec, work / "twin.yaml")
            print(f"calibrated in {live.suite.wall_s:.0f} s: {cal.residual_pct}; {saved}")
            for (section, name), v in cal.values.items():
                print(f"  {section}.{name} = {v:.4g} ± {cal.stderr[(section, name)]:.2g}")
            for o in live.suite.observations:  # what the probes measured
                print(f"  probe {o.probe} {o.metric} {o.value * 1e3:.2f} ms")
            # kept for refitting offline (Observation's fields)
            seen = [dataclasses.asdict(o) for o in live.suite.observations]
            (work / "probes.json").write_text(json.dumps(seen, indent=1))
        # a burst for the capacity, then the two loads (their order alternating);
        # the loads' rates are shares of the first round's burst capacity
        burst = burst_requests(i, k, a.quick)
        cap, sent = asyncio.run(measure(srv.url, burst))
        row["caps"].append(cap)
        row["bursts"].append((burst, sent))
        print(f"{label} {ea} burst run {k}: {json.dumps(cap)}", flush=True)
        for share in SHARES if k % 2 == 0 else SHARES[::-1]:
            rate = share * row["caps"][0]["request_throughput"]
            wl = load_requests(i, share, rate, k, a.quick)
            m, sent = asyncio.run(measure(srv.url, wl))
            load = row["loads"].setdefault(str(share), {"rate": rate, "runs": [], "sent": []})
            load["runs"].append(m)
            load["sent"].append((wl, sent))
            print(f"{label} {ea} share {share} run {k}: {json.dumps(m)}", flush=True)
    for row in rows.values():
        row["capacity"] = {k: statistics.median(c[k] for c in row["caps"]) for k in row["caps"][0]}
    # the measurements, for refitting or re-predicting offline (the workloads follow from
    # their seeds, requests() above)
    kept = {
        label: {
            "engine_args": row["engine_args"],
            "caps": row["caps"],
            "burst_sent": [sent for _, sent in row["bursts"]],
            "loads": {
                s: {"rate": v["rate"], "runs": v["runs"], "sent": [t for _, t in v["sent"]]}
                for s, v in row["loads"].items()
            },
        }
        for label, row in rows.items()
    }
    (work / "measured.json").write_text(json.dumps(kept, indent=1))
    print(f"measurements: {work / 'measured.json'}", flush=True)
    assert twin is not None
    report(rows, model, base, twin, held, time.monotonic() - t0)


def report(
    rows: dict[str, Any], model: Any, base: Any, twin: Any, held: list[Any], wall: float
) -> dict[str, Any]:
    """Print every point's predicted and measured figures, the held-out errors per
    predictor and the JSON line; returns what that line holds."""
    cal = rows["calibration"]
    errs: dict[str, dict[str, list[float]]] = {p: {} for p in ("twin", "sim", "constant")}
    spreads: dict[str, list[float]] = {}
    points = []
    for label, row in rows.items():
        ea = row["engine_args"]
        # the capacity's own band: its bursts' spread
        band = spread([c["output_throughput"] for c in row["caps"]])
        if band is not None:
            spreads.setdefault("capacity", []).append(band)
        for p, hw in (("twin", twin), ("sim", base)):
            cap_pred = predicted_as_sent(model, hw, ea, row["bursts"])["output_throughput"]
            e = err(cap_pred, row["capacity"]["output_throughput"])
            if label != "calibration":
                errs[p].setdefault("capacity", []).append(e)
            points.append((label, "capacity", p, cap_pred, row["capacity"]["output_throughput"]))
        if label != "calibration":
            c = cal["capacity"]["output_throughput"]
            errs["constant"].setdefault("capacity", []).append(
                err(c, row["capacity"]["output_throughput"])
            )
        for share, load in row["loads"].items():
            runs = load["runs"]
            med = {k: statistics.median(r[k] for r in runs) for k in METRICS}
            for k in METRICS:
                band = spread([r[k] for r in runs])
                if band is not None:
                    spreads.setdefault(k, []).append(band)
            preds = {
                "twin": predicted_as_sent(model, twin, ea, load["sent"]),
                "sim": predicted_as_sent(model, base, ea, load["sent"]),
                "constant": {
                    k: statistics.median(r[k] for r in cal["loads"][share]["runs"]) for k in METRICS
                },
            }
            for p, pr in preds.items():
                for k in METRICS:
                    points.append((label, f"{k}@{share}", p, pr[k], med[k]))
                    if label != "calibration":
                        errs[p].setdefault(k, []).append(err(pr[k], med[k]))
    print(f"\n{'point':<14}{'figure':<26}{'predictor':<10}{'predicted':>12}{'measured':>12}")
    for label, fig, p, pv, mv in points:
        print(f"{label:<14}{fig:<26}{p:<10}{pv:>12.2f}{mv:>12.2f}")
    print(f"\nheld-out errors, % (max / median) over {len(held)} configs x {len(SHARES)} loads:")
    for p, by in errs.items():
        line = ", ".join(
            f"{k} {max(v):.1f}/{statistics.median(v):.1f}"
            for k, v in ((k, [x for x in v if x == x]) for k, v in by.items())
            if v
        )
        print(f"  {p:<9} {line}")
    noise = {k: round(statistics.median(v), 2) for k, v in spreads.items()}
    print(f"noise band (median spread of the repeats, %): {noise}; wall {wall:.0f} s")

    def mx(p: str, k: str, of: Any = max) -> float | None:
        vals = [v for v in errs[p].get(k, []) if v == v]  # NaN: nothing measured to compare
        return round(of(vals), 2) if vals else None

    out = {
        "heldout_throughput_err_pct_max": mx("twin", "capacity"),
        "heldout_p50_ttft_err_pct_max": mx("twin", "median_ttft_ms"),
        "heldout_p50_tpot_err_pct_max": mx("twin", "median_tpot_ms"),
        "heldout_engine_itl_err_pct_max": mx("twin", "engine_itl_ms"),
        "noise_band_pct": max(noise.values()) if noise else None,
        "noise_band_by_metric_pct": noise,
        "constant_predictor_err_pct_max": {k: mx("constant", k) for k in HEADLINE},
        "uncalibrated_err_pct_max": {k: mx("sim", k) for k in HEADLINE},
        "twin_err_pct_max": {k: mx("twin", k) for k in errs["twin"]},
        "twin_err_pct_median": {k: mx("twin", k, statistics.median) for k in errs["twin"]},
        "heldout_configs": len(held),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
