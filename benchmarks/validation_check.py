"""The validation phase's figures for ``benchmarks/tuning_quality.py``
(docs/tuning.md#7-validation), kept apart from the search's figures.

The interval a study reports is checked against the gain re-measured on ``FRESH_SEEDS``, ten
other workload samples, with jitter on (the study's own protocol), paired per sample: the mean
of those paired gains estimates the quantity the interval estimates. The final recommendation
(the phase's) is also measured under the ground-truth protocol beside the baseline, to count
recommendations more than one lattice step below the baseline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import warnings
from typing import Any

import optuna
from truth import args_key, pct, scenario_config

from autotune.profiles.models import get_model
from autotune.report.recommend import recommend
from autotune.tuning.measure.interval import summary_of
from autotune.tuning.measure.protocol import GROUND_TRUTH, measure_config, study_protocol
from autotune.workload.build import workload_sample

__all__ = [
    "FRESH_SEEDS",
    "fresh_figure",
    "ground_capacity",
    "search_only",
    "search_only_figures",
    "validation_figures",
    "validation_of",
]


def _quiet() -> None:
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.WARNING)


FRESH_SEEDS = tuple(900_001 + j for j in range(10))


def validation_of(cfg: Any, trials: list[Any], repeats: list[Any]) -> dict[str, Any] | None:
    """What the study's validation phase reported: the verdict and the interval of the
    candidate it ranked first (the recommended one, or the best one when it says keep)."""
    summary = summary_of(cfg, repeats, trials)
    if summary is None or not summary.complete:
        return None
    cand = summary.candidate(summary.best)
    by_number = {t.optuna_trial_number: t for t in trials}
    iv = cand.interval if cand is not None else None
    return {
        "verdict": summary.verdict,
        "keep": summary.verdict == "keep",
        "candidate": by_number[cand.trial_number].engine_args if cand is not None else None,
        "interval": iv.to_dict() if iv is not None else None,
        "runs": summary.runs_done,
    }


def search_only(cfg: Any, trials: list[Any]) -> dict[str, Any] | None:
    """What the study would recommend without its validation phase (its best trial)."""
    r = recommend(cfg, trials)
    if r is None:
        return None
    return {"engine_args": r.engine_args, "gain_pct": r.gain_pct}


def search_only_figures(studies: list[dict[str, Any]], cache: Any) -> dict[str, Any]:
    """Per strategy, the final recommendation's % of the best known config (median, worst)
    and its largest gain error, with and without the validation phase, from the same
    studies (the search-only one is the study's best trial)."""
    out: dict[str, Any] = {}
    for strategy in sorted({st["strategy"] for st in studies}):
        pcts: dict[str, list[float]] = {"with": [], "without": []}
        errs: dict[str, list[float]] = {"with": [], "without": []}
        for st in (s for s in studies if s["strategy"] == strategy):
            entry = cache.scenario(st["scenario"])
            best = entry["best_known"]["objective"]
            base = entry["remeasured"][args_key(st["baseline"])]
            final = st["recs"].get(max(st["recs"])) if st["recs"] else None
            for tag, r in (("with", final), ("without", st["search_rec"])):
                if r is None:
                    continue
                gt = entry["remeasured"][args_key(r["engine_args"])]
                pcts[tag].append(pct(gt, best))
                if r["gain_pct"] is not None and base > 0:
                    errs[tag].append(abs(r["gain_pct"] - 100.0 * (gt / base - 1.0)))
        d: dict[str, Any] = {}
        for tag in ("with", "without"):
            p, e = pcts[tag], errs[tag]
            d[f"median_pct_of_best_{tag}"] = round(statistics.median(p), 2) if p else None
            d[f"worst_pct_of_best_{tag}"] = round(min(p), 2) if p else None
            d[f"max_gain_error_pp_{tag}"] = round(max(e), 2) if e else None
        out[strategy] = d
    print("\nfinal recommendation, % of best known, median (worst), with / without validation:")
    for strategy, d in out.items():
        print(
            f"  {strategy:8s} with {d['median_pct_of_best_with']} ({d['worst_pct_of_best_with']})"
            f", without {d['median_pct_of_best_without']} ({d['worst_pct_of_best_without']}); "
            f"max gain error {d['max_gain_error_pp_with']} / {d['max_gain_error_pp_without']} pp"
        )
    return out


def fresh_figure(task: tuple[str, str, int]) -> tuple[str, str, int, float | None]:
    """One config's figure (slo-capacity: capacity; offline: throughput) on fresh sample
    ``seed``, with jitter on; None when it met no load."""
    _quiet()
    name, key, seed = task
    cfg, _ = scenario_config(name)
    wl, _ = workload_sample(cfg, seed, vocab_size=get_model(cfg.model.name).vocab_size)
    m = asyncio.run(
        measure_config(cfg, json.loads(key), study_protocol(cfg), workload=wl, seed=seed)
    )
    fig = m.capacity_scale if cfg.mode == "slo-capacity" else (m.objective or None)
    return name, key, seed, fig


def ground_capacity(task: tuple[str, str]) -> tuple[str, str, float | None]:
    """A config's capacity (offline: throughput) under the ground-truth protocol."""
    _quiet()
    name, key = task
    cfg, _ = scenario_config(name)
    m = asyncio.run(measure_config(cfg, json.loads(key), GROUND_TRUTH))
    return name, key, m.capacity_scale if cfg.mode == "slo-capacity" else (m.objective or None)


def validation_figures(pool: Any, studies: list[dict[str, Any]]) -> dict[str, Any]:
    """``ci_covers_remeasured_pct``: the share of studies whose reported interval contains the
    re-measured gain; and how many final recommendations lie more than one lattice step
    (1 %) below the baseline under the ground-truth protocol."""
    done = [st for st in studies if st["validation"]]
    fresh = sorted(
        {
            (st["scenario"], args_key(a), seed)
            for st in done
            for a in (st["validation"]["candidate"], st["baseline"])
            if a is not None
            for seed in FRESH_SEEDS
        }
    )
    figs = {(n, k, s): f for n, k, s, f in pool.map(fresh_figure, fresh, chunksize=1)}
    finals = {
        (st["scenario"], args_key(a))
        for st in studies
        for a in (st["recs"][max(st["recs"])]["engine_args"], st["baseline"])
        if st["recs"] and st["recs"][max(st["recs"])]
    }
    gt = {(n, k): c for n, k, c in pool.map(ground_capacity, sorted(finals), chunksize=1)}
    rows, below = [], []
    for st in done:
        v, name = st["validation"], st["scenario"]
        cand, base = args_key(v["candidate"]), args_key(st["baseline"])
        gains = [
            100.0 * (figs[(name, cand, s)] / figs[(name, base, s)] - 1.0)
            for s in FRESH_SEEDS
            if figs[(name, cand, s)] and figs[(name, base, s)]
        ]
        iv = v["interval"]
        if not gains or iv is None or iv["low"] is None:
            continue
        g = statistics.fmean(gains)
        rows.append(
            {
                "scenario": name,
                "strategy": st["strategy"],
                "seed": st["seed"],
                "verdict": v["verdict"],
                "mean": iv["mean"],
                "low": iv["low"],
                "high": iv["high"],
                "remeasured": g,
                "pairs": len(gains),
                "covered": iv["low"] <= g <= iv["high"],
            }
        )
    for st in studies:
        r = st["recs"].get(max(st["recs"])) if st["recs"] else None
        if r is None:
            continue
        c, b = (
            gt.get((st["scenario"], args_key(r["engine_args"]))),
            gt.get((st["scenario"], args_key(st["baseline"]))),
        )
        if b and (c or 0.0) < b / 1.01 * (1 - 1e-9):
            below.append(f"{st['scenario']} {st['strategy']} seed {st['seed']}")
    print("\nvalidation: reported interval vs gain re-measured on 10 fresh samples (jitter on)")
    for r in rows:
        print(
            f"  {r['scenario']:22s} {r['strategy']:8s} seed {r['seed']}: {r['verdict']:9s} "
            f"{r['mean']:+6.2f} % [{r['low']:+6.2f}, {r['high']:+6.2f}] vs "
            f"{r['remeasured']:+6.2f} % ({r['pairs']} pairs) {'ok' if r['covered'] else 'MISSED'}"
        )
    return {
        "ci_covers_remeasured_pct": round(100.0 * sum(r["covered"] for r in rows) / len(rows), 1)
        if rows
        else None,
        "validated_studies": len(done),
        "intervals_checked": len(rows),
        "keep_pct": round(100.0 * sum(st["validation"]["keep"] for st in done) / len(done), 1)
        if done
        else None,
        "below_baseline_by_more_than_a_step": below,
    }
