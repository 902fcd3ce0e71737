"""``study export``: every trial of a study as JSON (schema :data:`EXPORT_SCHEMA`,
docs/report.md#5-machine-readable-output) or CSV, with the validation's figures."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from autotune.config import StudyConfig
from autotune.redact import mask_argv, mask_command, mask_text
from autotune.report.bounds import trial_capacity
from autotune.report.levels import export_level
from autotune.report.recommend import replicas_needed, top_level_figures
from autotune.report.validated import ValidatedConfig, validated_configs, validated_json
from autotune.store import RepeatRecord, StudyRecord, TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.findings import capacity_rps, why_infeasible
from autotune.tuning.measure.interval import ValidationSummary, summary_of
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.measure.noise import NoiseRecord

__all__ = ["EXPORT_SCHEMA", "export_csv", "export_json", "trial_rows", "validation_columns"]


def trial_rows(
    trials: list[TrialRecord], mode: str = "slo-capacity", lattice: Lattice | None = None
) -> list[dict[str, Any]]:
    rows = []
    for t in trials:
        top = top_level_figures(t) or {}
        cap = trial_capacity(t, lattice, mode)
        rows.append(
            {
                "trial": t.optuna_trial_number,
                "stage": t.stage,
                "state": t.state,
                **{
                    k: t.engine_args.get(k)
                    for k in (
                        "max_model_len",
                        "gpu_memory_utilization",
                        "max_num_seqs",
                        "max_num_batched_tokens",
                    )
                },
                "objective": t.objective,
                "feasible": t.feasible,
                "capacity_scale": t.capacity_scale,
                "capacity_rps": capacity_rps(t),
                # beside the number: at_top is "≥", below_low "<" (docs/usage.md#1-commands)
                "capacity_status": cap.status if cap is not None else None,
                "capacity_bound": cap.bound if cap is not None else None,
                "p99_ttft_ms": top.get("p99_ttft_ms"),
                "p99_tpot_ms": top.get("p99_tpot_ms"),
                "stopped": top.get("stopped"),
                "failure_class": t.failure_class,
                "why_infeasible": why_infeasible(t, mode),
                "kv_cache_tokens": t.kv_cache_tokens,
                "diagnosis": (t.diagnosis or {}).get("kind") if t.diagnosis else None,
                "inferred_from": t.inferred_from,
            }
        )
    return rows


EXPORT_SCHEMA = "autotune.study-export/1"
# what `study export` leaves out of each level unless --full: the telemetry summary
# (histogram buckets, gauge statistics, the time series), the full metrics mapping and the
# diagnosis' evidence; the level's typed columns, violations and diagnosis (kind and
# suggestion) stay, and so does each trial's own diagnosis with its evidence
_FULL_ONLY = ("metrics", "telemetry")


def _validation_json(
    cfg: StudyConfig | None,
    repeats: list[RepeatRecord] | None,
    trials: list[TrialRecord],
    noise: NoiseRecord | None = None,
) -> dict[str, Any] | None:
    if not repeats:
        return None
    summary = summary_of(cfg, repeats, trials, noise) if cfg is not None else None
    runs = []
    for r in repeats:
        d = asdict(r)
        d.pop("study_name", None)
        runs.append(d)
    # each config's validated figure (the median over its runs, with its bound) and gain
    figures = validated_configs(summary, repeats, cfg) if cfg is not None and summary else []
    return {
        "summary": summary.to_dict() if summary is not None else None,
        "configs": validated_json(figures) if summary is not None and summary.complete else [],
        "runs": runs,
    }


_BLANK = dict.fromkeys(
    (
        "validated_capacity_scale",
        "validated_capacity_bound",
        "validated_gain_pct",
        "validated_ci_low_pct",
        "validated_ci_high_pct",
        "validated_paired_runs",
        "validated_slo_held",
    )
)


def validation_columns(
    trials: list[TrialRecord],
    summary: ValidationSummary | None,
    figures: Sequence[ValidatedConfig] = (),
) -> dict[int, dict[str, Any]]:
    """Per trial number: its validated capacity (``figures``: the baseline's too) and, for
    a candidate, its gain and interval (a complete phase only)."""
    out: dict[int, dict[str, Any]] = {}
    if summary is None or not summary.complete:
        return out
    by = {(f.trial, f.baseline): f for f in figures}

    def cap(trial: int, baseline: bool) -> dict[str, Any]:
        f = by.get((trial, baseline))
        c = f.capacity if f is not None else None
        return {
            "validated_capacity_scale": c.scale if c is not None else None,
            "validated_capacity_bound": c.bound if c is not None else None,
        }

    base = summary.baseline
    out[summary.baseline_trial] = _BLANK | {
        **cap(summary.baseline_trial, True),
        "validated_slo_held": f"{base.all_held}/{base.all_runs}",
    }
    for c in summary.candidates:
        iv = c.interval
        out[c.trial_number] = {
            **cap(c.trial_number, False),
            "validated_gain_pct": iv.mean if iv is not None else None,
            "validated_ci_low_pct": iv.low if iv is not None and iv.n > 1 else None,
            "validated_ci_high_pct": iv.high if iv is not None and iv.n > 1 else None,
            "validated_paired_runs": iv.n if iv is not None else 0,
            "validated_slo_held": f"{c.slo_held}/{c.runs}",
        }
    return out


def export_json(
    study: StudyRecord,
    trials: list[TrialRecord],
    repeats: list[RepeatRecord] | None = None,
    cfg: StudyConfig | None = None,
    *,
    full: bool = False,
    noise: NoiseRecord | None = None,
) -> str:
    """The study, every trial and the validation phase as compact JSON (schema
    :data:`EXPORT_SCHEMA`, docs/report.md#5-machine-readable-output); ``full`` keeps each
    level's telemetry, full metrics and diagnosis evidence."""

    lattice = lattice_of(cfg) if cfg is not None else None

    # Stored records are masked when written; masking again covers databases written before
    # autotune masked them (autotune.redact).
    def trial(t: TrialRecord) -> dict[str, Any]:
        d = asdict(t)
        d.pop("study_name", None)
        if d.get("launch_command"):
            d["launch_command"] = mask_command(d["launch_command"])
        if d.get("launch_argv"):
            d["launch_argv"] = mask_argv(d["launch_argv"])
        if d.get("log_tail"):
            d["log_tail"] = mask_text(d["log_tail"])
        for row, lv in zip(d["levels"], t.levels, strict=True):
            export_level(row, lv)  # a stopped level: what it measured, why and when
        if not full:
            for lv in d["levels"]:
                for key in _FULL_ONLY:
                    lv.pop(key, None)
                if isinstance(lv.get("diagnosis"), dict):
                    lv["diagnosis"] = {k: lv["diagnosis"].get(k) for k in ("kind", "suggestion")}
                # 5 significant digits: far finer than any level's noise (the full export
                # keeps every digit); the compact export stays small as studies grow
                for row in (lv, *(lv.get("violations") or ())):  # a violation's value too
                    for k, v in row.items():
                        if isinstance(v, float) and math.isfinite(v):
                            row[k] = float(f"{v:.5g}")
        d["capacity_rps"] = capacity_rps(t)
        cap = trial_capacity(t, lattice, study.mode)
        d["capacity"] = cap.to_dict() if cap is not None else None  # with its bound
        d["replicas_needed"] = replicas_needed(t.capacity_scale)
        d["why_infeasible"] = why_infeasible(t, study.mode)
        return d

    study_d = asdict(study)
    study_d["config_yaml"] = mask_text(study_d["config_yaml"])
    body = {
        "schema": EXPORT_SCHEMA,
        "full": full,
        "study": study_d,
        "trials": [trial(t) for t in trials],
        # the validation phase's runs and summary (docs/tuning.md#7-validation); None: none
        "validation": _validation_json(cfg, repeats, trials, noise),
        # the device time of every worker, trials and validation (docs/cost.md)
        "cost": study_cost(trials, repeats or ()).to_dict(),
    }
    return json.dumps(body, separators=(",", ":"), default=str)


def export_csv(
    trials: list[TrialRecord],
    mode: str = "slo-capacity",
    validation: ValidationSummary | None = None,
    *,
    cfg: StudyConfig | None = None,
    repeats: Sequence[RepeatRecord] = (),
) -> str:
    """One row per trial; with the study's ``cfg`` and ``repeats``, its capacity's bound
    and each re-measured config's validated capacity."""
    lattice = lattice_of(cfg) if cfg is not None else None
    rows = trial_rows(trials, mode, lattice)
    figures = validated_configs(validation, repeats, cfg) if cfg is not None else []
    extra = validation_columns(trials, validation, figures)
    rows = [r | (extra.get(r["trial"]) or _BLANK) for r in rows]
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()
