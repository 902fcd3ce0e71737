"""One stored load level as llm-d's benchmark report, version 0.2 (pure;
docs/report.md#8-per-request-exports).

llm-d-benchmark (``llmdbenchmark/analysis/benchmark_report``) describes one measured point
per report: the run, the stack and the load that were measured (``scenario``) and the
request-level results. Each of autotune's levels is such a point, so each becomes one report;
the level's index is the load's ``stage``, as a multi-stage load generator numbers its stages.
With the level's per-request records the statistics are computed from them (every percentile
the schema names, min and max); without, from the figures the level stored (mean, standard
deviation and the percentiles the load generator reports).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune import __version__
from autotune.config import StudyConfig
from autotune.loadgen.bench_stats import RequestRecord, percentile_key
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stopped import StopInfo
from autotune.store import LevelRecord, StudyRecord, TrialRecord
from autotune.workers.devices import devices_held, flag_name

__all__ = ["LLMD_REPORT_VERSION", "llmd_report"]

LLMD_REPORT_VERSION = "0.2"
# the schema's percentile names and the percentiles they stand for
_PERCENTILES = {
    "p0p1": 0.1,
    "p1": 1.0,
    "p5": 5.0,
    "p10": 10.0,
    "p25": 25.0,
    "p50": 50.0,
    "p75": 75.0,
    "p90": 90.0,
    "p95": 95.0,
    "p99": 99.0,
    "p99p9": 99.9,
}
# the ones the load generator's summary holds (docs/loadgen.md#13-statistics-and-percentiles)
_SUMMARY_PERCENTILES = ("p50", "p90", "p95", "p99", "p99p9")
# sources of prompt text: generated from the vocabulary, else sampled from a dataset or trace
_RANDOM_SOURCES = ("synthetic", "random", "sharegpt-like")


def _stats(values: Sequence[float], units: str) -> dict[str, Any] | None:
    """The schema's statistics of ``values`` (numpy's linear percentiles, as the load
    generator takes them); None for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out: dict[str, Any] = {
        "units": units,
        "mean": float(np.mean(arr)),
        "stddev": float(np.std(arr)),
        "min": float(np.min(arr)),
        "max": float(np.max(arr)),
    }
    out.update({k: float(np.percentile(arr, p)) for k, p in _PERCENTILES.items()})
    return out


def _summary_stats(s: LevelMetrics, name: str, units: str) -> dict[str, Any] | None:
    """Statistics of ``name`` (``ttft``, ``tpot``, ``itl``, ``e2el``) from the level's stored
    summary, in seconds; None when the summary has none, or holds lower bounds of them (the
    latency an early stop restated over every request sent,
    docs/tuning.md#10-early-stop-inside-a-level), which the report cannot mark as such."""
    mean = s.summary.get(f"mean_{name}_ms")
    if mean is None or not s.completed or (s.stop is not None and s.stop.bound == name):
        return None
    out: dict[str, Any] = {"units": units, "mean": mean / 1000.0}
    if (std := s.summary.get(f"std_{name}_ms")) is not None:
        out["stddev"] = std / 1000.0
    for key in _SUMMARY_PERCENTILES:
        value = s.summary.get(f"{percentile_key(_PERCENTILES[key])}_{name}_ms")
        if value is not None:
            out[key] = value / 1000.0
    return out


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _latency(m: LevelMetrics, records: Sequence[RequestRecord] | None) -> dict[str, Any]:
    if records is None:
        return _drop_none(
            {
                "time_to_first_token": _summary_stats(m, "ttft", "s"),
                "time_per_output_token": _summary_stats(m, "tpot", "s/token"),
                "inter_token_latency": _summary_stats(m, "itl", "s/token"),
                "request_latency": _summary_stats(m, "e2el", "s"),
            }
        )
    ok = [r for r in records if r.success]
    return _drop_none(
        {
            "time_to_first_token": _stats([r.ttft for r in ok if r.ttft is not None], "s"),
            # vLLM's TPOT: per request of more than one token (docs/loadgen.md#1-metric-definitions)
            "time_per_output_token": _stats([r.tpot for r in ok if r.output_tokens > 1], "s/token"),
            "inter_token_latency": _stats([g for r in ok for g in r.itl], "s/token"),
            "request_latency": _stats([r.e2el for r in ok if r.e2el is not None], "s"),
            # NTPOT: the whole latency over every output token, the first included
            "normalized_time_per_output_token": _stats(
                [r.e2el / r.output_tokens for r in ok if r.e2el is not None and r.output_tokens],
                "s/token",
            ),
        }
    )


def _requests(m: LevelMetrics, records: Sequence[RequestRecord] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"total": m.total, "failures": m.failed}
    if m.stop is not None:  # the requests an early stop left unsent or unfinished
        out["incomplete"] = max(m.stop.planned - m.total, 0)
    if records is not None:
        ok = [r for r in records if r.success]
        out["input_length"] = _stats([float(r.input_tokens) for r in ok], "count")
        out["output_length"] = _stats([float(r.output_tokens) for r in ok], "count")
    elif m.completed:
        for key, total in (
            ("input_length", m.summary.get("total_input_tokens")),
            ("output_length", m.summary.get("total_output_tokens")),
        ):
            if total is not None:
                out[key] = {"units": "count", "mean": total / m.completed}
    return _drop_none(out)


def _throughput(m: LevelMetrics) -> dict[str, Any]:
    per_s = 1.0 / m.duration_s if m.duration_s > 0 else 0.0
    total_in = m.summary.get("total_input_tokens")
    return _drop_none(
        {
            "input_token_rate": None
            if total_in is None
            else {"units": "tokens/s", "mean": total_in * per_s},
            "output_token_rate": {"units": "tokens/s", "mean": m.output_throughput},
            "total_token_rate": None
            if total_in is None
            else {"units": "tokens/s", "mean": total_in * per_s + m.output_throughput},
            "request_rate": {"units": "queries/s", "mean": m.request_throughput},
        }
    )


def _seq_len(stats: dict[str, Any] | None) -> dict[str, Any]:
    """A load's sequence length as the level saw it: its mean, and its range when known."""
    if stats is None:
        return {"distribution": "other", "value": 0}
    lo, hi = stats.get("min"), stats.get("max")
    out: dict[str, Any] = {
        "distribution": "fixed" if lo is not None and lo == hi else "other",
        "value": stats["mean"],
    }
    if lo is not None and hi is not None:
        out |= {"min": int(lo), "max": max(1, int(hi))}
    if "stddev" in stats:
        out["std_dev"] = stats["stddev"]
    return out


def _engine(cfg: StudyConfig, trial: TrialRecord) -> dict[str, Any]:
    """The stack: one vLLM server with the trial's engine args (a simulated one says so)."""
    args = {**cfg.worker.static_args, **trial.engine_args}
    sizes = {flag_name(k): v for k, v in args.items()}
    simulated = cfg.worker.kind != "vllm"
    if simulated:
        from autotune.sim import ENGINE_MODEL_VERSION, VLLM_VERSION

        tool, version = "autotune-sim", f"{VLLM_VERSION} (engine model v{ENGINE_MODEL_VERSION})"
        what = f"simulated vLLM (worker {cfg.worker.kind}); not a measurement of real vLLM"
    else:
        tool, version, what = "vllm", "not recorded", "vllm serve"
    blob = json.dumps(args, sort_keys=True, default=str).encode()
    return {
        "metadata": {
            "schema_version": "0.0.1",
            "label": f"trial-{trial.optuna_trial_number}",
            "cfg_id": hashlib.sha256(blob).hexdigest()[:32],
            "description": f"{what}, trial {trial.optuna_trial_number} ({trial.stage})",
        },
        "standardized": {
            "kind": "inference_engine",
            "tool": tool,
            "tool_version": version,
            "role": "replica",
            "replicas": 1,
            "model": {"name": cfg.model.name},
            "accelerator": {
                "model": cfg.hardware,
                "count": devices_held(args, trial.devices),
                "parallelism": {
                    "tp": int(sizes.get("tensor_parallel_size") or 1),
                    "pp": int(sizes.get("pipeline_parallel_size") or 1),
                    "dp": int(sizes.get("data_parallel_size") or 1),
                },
            },
        },
        "native": {"args": {f"--{k.replace('_', '-')}": v for k, v in args.items()}},
    }


def _load(
    study: StudyRecord,
    cfg: StudyConfig,
    level: LevelRecord,
    requests: dict[str, Any],
) -> dict[str, Any]:
    wl = cfg.workload
    blob = json.dumps(wl.model_dump(mode="json"), sort_keys=True).encode()
    standardized: dict[str, Any] = {
        "tool": "autotune",
        "tool_version": __version__,
        "source": "random" if wl.source in _RANDOM_SOURCES else "sampled",
        "stage": level.level_index,
        "input_seq_len": _seq_len(requests.get("input_length")),
        "output_seq_len": _seq_len(requests.get("output_length")),
    }
    if level.offered_rate is not None and level.offered_rate > 0:
        standardized["rate_qps"] = level.offered_rate
    if wl.arrival == "closed" and wl.concurrency is not None:
        standardized["concurrency"] = wl.concurrency
    return {
        "metadata": {
            "schema_version": "0.0.1",
            "cfg_id": hashlib.sha256(blob).hexdigest()[:32],
            "description": (
                f"workload of study {study.name}: {wl.source}, {wl.arrival} arrivals, "
                f"at {level.scale:g}x its rate"
            ),
        },
        "standardized": standardized,
        "native": {"config": {"workload": wl.model_dump(mode="json"), "scale": level.scale}},
    }


def llmd_report(
    study: StudyRecord,
    cfg: StudyConfig,
    trial: TrialRecord,
    level: LevelRecord,
    records: Sequence[RequestRecord] | None = None,
) -> dict[str, Any]:
    """One level of one trial as an llm-d benchmark report v0.2 (``records``: the level's
    per-request records, when it kept them). Its ``uid`` is the same every time the same
    level is exported; ``eid`` is the study's, so a study's reports group as one
    experiment."""
    m = LevelMetrics.from_summary(level.metrics, StopInfo.of(level.metrics))
    made = study.created_at.isoformat() if study.created_at is not None else ""
    experiment = f"autotune:{study.name}:{made}"
    point = f"{experiment}:{trial.optuna_trial_number}:{level.level_index}"
    requests = _requests(m, records)
    run: dict[str, Any] = {
        "uid": uuid.uuid5(uuid.NAMESPACE_URL, point).hex,
        "eid": uuid.uuid5(uuid.NAMESPACE_URL, experiment).hex,
        "description": (
            f"autotune study {study.name}, trial {trial.optuna_trial_number}, "
            f"level {level.level_index} ({level.scale:g}x the workload's rate)"
        ),
    }
    if m.duration_s > 0:
        run["time"] = {"duration": f"PT{m.duration_s:.6f}S"}
    return {
        "version": LLMD_REPORT_VERSION,
        "run": run,
        "scenario": {
            "stack": [_engine(cfg, trial)],
            "load": _load(study, cfg, level, requests),
        },
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": requests,
                    "latency": _latency(m, records),
                    "throughput": _throughput(m),
                }
            }
        },
    }
