"""The recommendation: the best feasible trial as a `vllm serve` command, its engine args,
its capacity in req/s and output tok/s (and the replicas the traffic needs when one is not
enough), and its gain over the baseline measured in the same study with the same protocol
(pure; takes stored records).

A gain is shown with its validation (docs/report.md#3-the-gain-and-its-validation): once
the validation phase is complete (docs/tuning.md#7-validation) the recommendation is the
config its paired intervals pick, with the gain's interval; "keep your current config" (the
baseline) with its reason when no candidate beats the baseline beyond noise; no command at
all when no config held its SLOs in every run (undecided); "not validated" before."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from autotune.config import StudyConfig
from autotune.profiles.flags import SIM_ONLY_FLAGS
from autotune.redact import mask_argv, mask_command, mask_text
from autotune.report.levels import export_level
from autotune.store import RepeatRecord, StudyRecord, TrialRecord
from autotune.tuning.findings import capacity_rps, record_stopped, why_infeasible
from autotune.tuning.interval import Interval, ValidationSummary, summary_of
from autotune.tuning.scoring import Slo, record_rank
from autotune.tuning.verdict import Held, held_text
from autotune.workers.vllm import format_command, vllm_argv

__all__ = [
    "BEST_SCHEMA",
    "EXPORT_SCHEMA",
    "Recommendation",
    "best_json",
    "capacity_rps",
    "export_csv",
    "export_json",
    "format_interval",
    "format_recommendation",
    "format_validation",
    "gain_text",
    "no_feasible_reason",
    "recommend",
    "replicas_needed",
    "trial_rows",
    "validation_columns",
    "why_infeasible",
]

BEST_SCHEMA = "autotune.study-best/1"


@dataclass
class Recommendation:
    trial: TrialRecord
    baseline: TrialRecord | None
    command: str
    engine_args: dict[str, Any]
    argv: list[str] | None = None
    # the validation phase's figures (None: no plan; not complete: not validated yet)
    validation: ValidationSummary | None = None
    validation_enabled: bool = True  # strategy.validate.enabled

    @property
    def validated(self) -> bool:
        v = self.validation
        return v is not None and v.complete and v.verdict is not None

    @property
    def keep(self) -> bool:
        """No candidate beats the baseline beyond noise: keep the current config."""
        return self.validated and self.validation is not None and self.validation.verdict == "keep"

    @property
    def undecided(self) -> bool:
        """No config held its SLOs in every run: nothing to recommend, and no command to
        print (docs/tuning.md#7-validation)."""
        v = self.validation
        return self.validated and v is not None and v.verdict == "undecided"

    @property
    def interval(self) -> Interval | None:
        """The reported gain interval: the recommended config's, or (keep) the best
        candidate's."""
        v = self.validation
        if not self.validated or v is None:
            return None
        c = v.candidate(v.best)
        return c.interval if c is not None else None

    @property
    def gain_pct(self) -> float | None:
        """The in-study gain: the two trials' objectives, measured with the same protocol."""
        b = self.baseline
        if b is None or not b.feasible or not b.objective or self.trial.objective is None:
            return None
        return 100.0 * (self.trial.objective / b.objective - 1.0)


def gain_text(rec: Recommendation) -> str:
    """The gain as one phrase: the validated interval, "keep your current config: ...",
    "+14.3 % (not validated)" (the in-study gain, one run each), or "n/a (why)"."""
    b, v, iv = rec.baseline, rec.validation, rec.interval
    why = (v.reason if v is not None else None) or "no candidate beats it beyond noise"
    if rec.keep:
        best = f"; best candidate {format_interval(iv)}" if iv is not None else ""
        return f"keep your current config: {why}{best}"
    if rec.validated and v is not None and v.verdict == "no-baseline":
        return f"n/a ({why})"
    if rec.undecided:
        return f"undecided: {why}"
    if rec.validated and iv is not None:
        return format_interval(iv)
    gain = rec.gain_pct
    if b is None:
        return "n/a (no baseline trial in this study)"
    if gain is None:
        why = f": {b.failure_class}" if b.failure_class else ""
        return f"n/a (baseline trial {b.optuna_trial_number} was infeasible{why})"
    return f"{gain:+.1f} % (not validated)"


def replicas_needed(capacity_scale: float | None) -> int | None:
    """Replicas of a config that serve the whole workload when one serves ``capacity_scale``
    times its rate (None when unknown)."""
    if capacity_scale is None or capacity_scale <= 0:
        return None
    return max(1, math.ceil(1.0 / capacity_scale - 1e-9))


def no_feasible_reason(trials: list[TrialRecord], mode: str = "slo-capacity") -> str:
    """The one line to print when a study has no feasible trial, naming why."""
    done = [t for t in trials if t.state == "COMPLETE"]
    if not done:
        return "no trial has completed yet"
    measured = [t for t in done if t.levels]
    if measured:
        # the trial that came closest: the highest lowest-load output throughput
        best = max(measured, key=lambda t: (t.headline_level() or t.levels[0]).output_throughput)
        return f"no feasible configuration: best try, trial {best.optuna_trial_number}: " + (
            why_infeasible(best, mode) or "infeasible"
        )
    classes = sorted({t.failure_class or "unknown" for t in done})
    return f"no feasible configuration: every worker failed to start ({', '.join(classes)})"


def _top_level(t: TrialRecord) -> dict[str, Any] | None:
    lv = t.headline_level()
    if lv is None:
        return None
    top: dict[str, Any] = {
        "scale": lv.scale,
        "p99_ttft_ms": lv.p99_ttft_ms,
        "p99_tpot_ms": lv.p99_tpot_ms,
        "output_throughput": lv.output_throughput,
        "feasible": lv.feasible,
    }
    if (s := record_stopped(lv)) is not None:  # only what it measured (None: not measured)
        top |= {k: s.values[k] for k in top if k in s.values} | {"stopped": s.stop.text}
    return top


def recommend(
    cfg: StudyConfig, trials: list[TrialRecord], repeats: list[RepeatRecord] | None = None
) -> Recommendation | None:
    """The recommendation from the stored trials and, when given and complete, the
    validation runs (``Store.repeats``)."""
    done = [t for t in trials if t.state == "COMPLETE"]
    feasible = [t for t in done if t.feasible and t.objective is not None]
    baseline = next((t for t in done if t.stage == "baseline"), None)
    summary = summary_of(cfg, repeats or [], trials)
    by_number = {t.optuna_trial_number: t for t in done}
    best: TrialRecord | None = None
    if summary is not None and summary.complete and summary.verdict is not None:
        pick = baseline if summary.verdict == "keep" else by_number.get(summary.chosen or -1)
        best = pick
    if best is None:
        if not feasible:
            return None
        slo = Slo.of(cfg.slo)
        best = max(feasible, key=lambda t: (*record_rank(cfg.mode, slo, t), -t.optuna_trial_number))
    static = {k: v for k, v in cfg.worker.static_args.items() if k not in SIM_ONLY_FLAGS}
    name = cfg.model.served_name
    argv = vllm_argv(
        ["vllm"],
        cfg.model.name,
        best.engine_args,
        static_args=static,
        host="0.0.0.0",
        port=8000,
        served_model_name=name,
    )
    # host/port are deployment choices, not tuned: leave them to the user
    cut = argv.index("--host")
    argv = argv[:cut] + argv[cut + 4 :]
    return Recommendation(
        best,
        baseline,
        format_command(argv),
        dict(best.engine_args),
        mask_argv(argv),
        summary,
        cfg.strategy.validate_.enabled,
    )


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def format_interval(iv: Interval) -> str:
    """E.g. ``+9.4 % (95 % CI +7.1 … +11.8 %, 3 paired runs)``."""
    conf = f"{100 * iv.confidence:.1f}".rstrip("0").rstrip(".")
    runs = f"{iv.n} paired run{'s' if iv.n != 1 else ''}"
    if iv.n < 2:
        return f"{_pct(iv.mean)} ({runs}: no interval; strategy.validate.repeats >= 2 gives one)"
    return f"{_pct(iv.mean)} ({conf} % CI {iv.low:+.1f} … {iv.high:+.1f} %, {runs})"


def format_validation(rec: Recommendation) -> list[str]:
    """The validation lines of ``study best``: the interval, "keep", or "not validated"."""
    v = rec.validation
    if v is None:
        why = "the validation phase has not run" if rec.validation_enabled else "off"
        return [f"validation: not validated (strategy.validate: {why})"]
    if not rec.validated:
        return [
            f"validation: not validated (the validation phase is incomplete: {v.runs_done} of "
            f"{v.runs_planned} runs; `autotune study run` continues it, after "
            "`--fail-running` when a killed run left some running)"
        ]
    what = f"{v.figure} over the baseline"
    best = v.candidate(v.best)
    lines = []
    why = v.reason or "no candidate beats it beyond noise"
    if v.verdict == "keep":
        lines.append(f"keep your current config: {why}")
        if best is not None and best.interval is not None:
            lines.append(
                f"  best candidate, trial {best.trial_number}: {what} "
                f"{format_interval(best.interval)}"
            )
    elif v.verdict == "no-baseline":
        lines.append(f"validated: {why} (no gain to give over a config that breaks them)")
    elif v.verdict == "undecided":
        lines.append(f"undecided, no recommendation: {why}")
        lines += _spread(v)
        if best is not None and best.interval is not None:
            lines.append(
                f"  best candidate, trial {best.trial_number}: {what} "
                f"{format_interval(best.interval)}"
            )
    elif best is not None and best.interval is not None:
        lines.append(f"validated gain in {what}: {format_interval(best.interval)}")
    # a broken over-length limit is named in the reason (autotune.tuning.verdict)
    return lines


def _spread(v: ValidationSummary) -> list[str]:
    """Each config's runs: how many held the SLOs and the range of its figure over them."""

    def line(who: str, h: Held, rng: tuple[float, float] | None) -> str:
        span = (
            (f"{rng[0]:,.4g}" if rng[0] == rng[1] else f"{rng[0]:,.4g}–{rng[1]:,.4g}")
            if rng
            else ""
        )
        fig = f"; {v.figure} {span} in the repeats where they held" if rng else ""
        return f"  {who}: the SLOs held {held_text(h)}{fig}"

    out = [line(f"baseline, trial {v.baseline_trial}", v.baseline, v.baseline_figure_range)]
    out += [line(f"trial {c.trial_number}", c.held, c.figure_range) for c in v.candidates]
    return out


def format_recommendation(rec: Recommendation) -> str:
    if rec.undecided:
        # no config held its SLOs in every run: no `vllm serve` command to recommend
        # (`study best` exits 4, docs/tuning.md#7-validation); the study's own best follows,
        # marked as such
        lines = [*format_validation(rec), "", "the study's best, not validated:"]
    else:
        lines = [rec.command, "", yaml.safe_dump(rec.engine_args, sort_keys=False).rstrip(), ""]
    t, b = rec.trial, rec.baseline
    top = _top_level(t)
    what = f"trial {t.optuna_trial_number} ({t.stage}): {t.objective:,.1f} output tok/s"
    rps = capacity_rps(t)
    if t.capacity_scale is not None:
        what += f" at {t.capacity_scale:.3f}x the workload's rate"
        if rps is not None:
            what += f" ({rps:,.2f} req/s)"
    lines.append(what)
    n = replicas_needed(t.capacity_scale)
    if n is not None and n > 1 and t.capacity_scale is not None:
        full = f" of {rps / t.capacity_scale:,.2f} req/s" if rps is not None else ""
        lines.append(
            f"  one replica serves {100 * t.capacity_scale:.0f} % of the workload's traffic "
            f"({rps or 0:,.2f}{full}): the traffic needs {n} replicas of this config"
        )
    if top:
        lines.append(
            f"  p99 TTFT {top['p99_ttft_ms']:.1f} ms, p99 TPOT {top['p99_tpot_ms']:.1f} ms"
            if top["p99_ttft_ms"] is not None and top["p99_tpot_ms"] is not None
            else "  (no latency figures)"
        )
    gain = rec.gain_pct
    if b is None:
        lines.append("gain over baseline: n/a (no baseline trial in this study)")
    elif gain is None:
        lines.append(
            f"gain over baseline: n/a (baseline trial {b.optuna_trial_number} was "
            f"infeasible{': ' + b.failure_class if b.failure_class else ''})"
        )
    elif t is not b:
        lines.append(
            f"gain over baseline (trial {b.optuna_trial_number}, vLLM defaults "
            f"{b.objective:,.1f} tok/s): {gain:+.1f}% in the study (one run each)"
        )
    else:
        lines.append("gain over baseline: none (the best trial is the baseline itself)")
    if not rec.undecided:
        lines += format_validation(rec)
    return "\n".join(lines)


def best_json(study: str, rec: Recommendation) -> dict[str, Any]:
    """``study best --json``: schema :data:`BEST_SCHEMA`,
    docs/report.md#5-machine-readable-output."""
    t, b = rec.trial, rec.baseline
    top = _top_level(t) or {}
    iv = rec.interval
    return {
        "schema": BEST_SCHEMA,
        "study": study,
        "trial": t.optuna_trial_number,
        "stage": t.stage,
        # undecided: no config held its SLOs in every run, so no command is recommended
        "command": None if rec.undecided else rec.command,
        "argv": None if rec.undecided else rec.argv,
        "engine_args": rec.engine_args,
        "output_tok_s": t.objective,
        "capacity_scale": t.capacity_scale,
        "capacity_rps": capacity_rps(t),
        "replicas_needed": replicas_needed(t.capacity_scale),
        "p99_ttft_ms": top.get("p99_ttft_ms"),
        "p99_tpot_ms": top.get("p99_tpot_ms"),
        "baseline": None
        if b is None
        else {
            "trial": b.optuna_trial_number,
            "feasible": b.feasible,
            "output_tok_s": b.objective,
            "capacity_scale": b.capacity_scale,
            "engine_args": b.engine_args,
        },
        "gain": {
            "pct": iv.mean if rec.validated and iv is not None else rec.gain_pct,
            "in_study_pct": rec.gain_pct,
            "validated": rec.validated,
            "keep": rec.keep,
            "verdict": rec.validation.verdict if rec.validated and rec.validation else None,
            "reason": rec.validation.reason if rec.validated and rec.validation else None,
            "interval": None
            if iv is None or iv.n < 2
            else {
                "low_pct": iv.low,
                "high_pct": iv.high,
                "confidence": iv.confidence,
                "runs": iv.n,
            },
            "text": gain_text(rec),
        },
    }


def trial_rows(trials: list[TrialRecord], mode: str = "slo-capacity") -> list[dict[str, Any]]:
    rows = []
    for t in trials:
        top = _top_level(t) or {}
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
                "p99_ttft_ms": top.get("p99_ttft_ms"),
                "p99_tpot_ms": top.get("p99_tpot_ms"),
                "stopped": top.get("stopped"),
                "failure_class": t.failure_class,
                "why_infeasible": why_infeasible(t, mode),
                "kv_cache_tokens": t.kv_cache_tokens,
                "diagnosis": (t.diagnosis or {}).get("kind") if t.diagnosis else None,
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
    cfg: StudyConfig | None, repeats: list[RepeatRecord] | None, trials: list[TrialRecord]
) -> dict[str, Any] | None:
    if not repeats:
        return None
    summary = summary_of(cfg, repeats, trials) if cfg is not None else None
    runs = []
    for r in repeats:
        d = asdict(r)
        d.pop("study_name", None)
        runs.append(d)
    return {"summary": summary.to_dict() if summary is not None else None, "runs": runs}


def validation_columns(
    trials: list[TrialRecord], summary: ValidationSummary | None
) -> dict[int, dict[str, Any]]:
    """Per trial number: its validated gain and interval (candidates of a complete phase)."""
    out: dict[int, dict[str, Any]] = {}
    if summary is None or not summary.complete:
        return out
    for c in summary.candidates:
        iv = c.interval
        out[c.trial_number] = {
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
) -> str:
    """The study, every trial and the validation phase as compact JSON (schema
    :data:`EXPORT_SCHEMA`, docs/report.md#5-machine-readable-output); ``full`` keeps each
    level's telemetry, full metrics and diagnosis evidence."""

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
        "validation": _validation_json(cfg, repeats, trials),
    }
    return json.dumps(body, separators=(",", ":"), default=str)


def export_csv(
    trials: list[TrialRecord],
    mode: str = "slo-capacity",
    validation: ValidationSummary | None = None,
) -> str:
    rows = trial_rows(trials, mode)
    extra = validation_columns(trials, validation)
    blank = dict.fromkeys(
        (
            "validated_gain_pct",
            "validated_ci_low_pct",
            "validated_ci_high_pct",
            "validated_paired_runs",
            "validated_slo_held",
        )
    )
    rows = [r | (extra.get(r["trial"]) or blank) for r in rows]
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()
