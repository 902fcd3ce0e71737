"""The recommendation: the best feasible trial as a `vllm serve` command, its engine args,
and its gain over the baseline measured in the same study (pure; takes stored records)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from autotune.config import StudyConfig
from autotune.store import StudyRecord, TrialRecord
from autotune.workers.vllm import format_command, vllm_argv

__all__ = ["Recommendation", "export_csv", "export_json", "format_recommendation", "recommend",
           "trial_rows"]

# sim-only flags never belong in a real `vllm serve` command
_SIM_ONLY = {"hardware", "time_scale", "sim_seed", "sim_startup_delay", "sim_jitter_cv"}


@dataclass
class Recommendation:
    trial: TrialRecord
    baseline: TrialRecord | None
    command: str
    engine_args: dict[str, Any]

    @property
    def gain_pct(self) -> float | None:
        b = self.baseline
        if b is None or not b.feasible or not b.objective or self.trial.objective is None:
            return None
        return 100.0 * (self.trial.objective / b.objective - 1.0)


def _top_level(t: TrialRecord) -> dict[str, Any] | None:
    lv = t.headline_level()
    if lv is None:
        return None
    return {"scale": lv.scale, "p99_ttft_ms": lv.p99_ttft_ms, "p99_tpot_ms": lv.p99_tpot_ms,
            "output_throughput": lv.output_throughput, "feasible": lv.feasible}


def recommend(cfg: StudyConfig, trials: list[TrialRecord]) -> Recommendation | None:
    done = [t for t in trials if t.state == "COMPLETE"]
    feasible = [t for t in done if t.feasible and t.objective is not None]
    if not feasible:
        return None
    best = max(feasible, key=lambda t: (t.objective or 0.0, -t.optuna_trial_number))
    baseline = next((t for t in done if t.stage == "baseline"), None)
    static = {k: v for k, v in cfg.worker.static_args.items() if k not in _SIM_ONLY}
    name = cfg.model.served_name
    argv = vllm_argv(["vllm"], cfg.model.name, best.engine_args, static_args=static,
                     host="0.0.0.0", port=8000, served_model_name=name)
    # host/port are deployment choices, not tuned: leave them to the user
    cut = argv.index("--host")
    argv = argv[:cut] + argv[cut + 4:]
    return Recommendation(best, baseline, format_command(argv), dict(best.engine_args))


def format_recommendation(rec: Recommendation) -> str:
    lines = [rec.command, "", yaml.safe_dump(rec.engine_args, sort_keys=False).rstrip(), ""]
    t, b = rec.trial, rec.baseline
    top = _top_level(t)
    what = f"trial {t.optuna_trial_number} ({t.stage}): {t.objective:,.1f} output tok/s"
    if t.capacity_scale is not None:
        what += f" at {t.capacity_scale:.2f}x the workload's rate"
    lines.append(what)
    if top:
        lines.append(f"  p99 TTFT {top['p99_ttft_ms']:.1f} ms, p99 TPOT {top['p99_tpot_ms']:.1f} ms"
                     if top["p99_ttft_ms"] is not None and top["p99_tpot_ms"] is not None
                     else "  (no latency figures)")
    gain = rec.gain_pct
    if b is None:
        lines.append("gain over baseline: n/a (no baseline trial in this study)")
    elif gain is None:
        lines.append(f"gain over baseline: n/a (baseline trial {b.optuna_trial_number} was "
                     f"infeasible{': ' + b.failure_class if b.failure_class else ''})")
    else:
        lines.append(f"gain over baseline (trial {b.optuna_trial_number}, vLLM defaults "
                     f"{b.objective:,.1f} tok/s): {gain:+.1f}%")
    return "\n".join(lines)


def trial_rows(trials: list[TrialRecord]) -> list[dict[str, Any]]:
    rows = []
    for t in trials:
        top = _top_level(t) or {}
        rows.append({
            "trial": t.optuna_trial_number, "stage": t.stage, "state": t.state,
            **{k: t.engine_args.get(k) for k in ("max_model_len", "gpu_memory_utilization",
                                                  "max_num_seqs", "max_num_batched_tokens")},
            "objective": t.objective, "feasible": t.feasible, "capacity_scale": t.capacity_scale,
            "p99_ttft_ms": top.get("p99_ttft_ms"), "p99_tpot_ms": top.get("p99_tpot_ms"),
            "failure_class": t.failure_class, "kv_cache_tokens": t.kv_cache_tokens,
            "diagnosis": (t.diagnosis or {}).get("kind") if t.diagnosis else None,
        })
    return rows


def export_json(study: StudyRecord, trials: list[TrialRecord]) -> str:
    def trial(t: TrialRecord) -> dict[str, Any]:
        d = asdict(t)
        d.pop("study_name", None)
        return d
    body = {"study": asdict(study), "trials": [trial(t) for t in trials]}
    return json.dumps(body, indent=2, default=str)


def export_csv(trials: list[TrialRecord]) -> str:
    rows = trial_rows(trials)
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()
