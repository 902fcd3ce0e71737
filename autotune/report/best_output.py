"""What ``study best`` prints: the recommended ``vllm serve`` command with its engine args,
figures, gain and validation lines, and the same as JSON (``--json``, schema
:data:`BEST_SCHEMA`, docs/report.md#5-machine-readable-output)."""

from __future__ import annotations

from typing import Any

import yaml

from autotune.report.bounds import widen_hint
from autotune.report.recommend import (
    Recommendation,
    format_interval,
    gain_text,
    replicas_needed,
    top_level_figures,
)
from autotune.report.validated import (
    interval_text,
    validated_json,
    validated_lines,
)
from autotune.tuning.measure.findings import capacity_rps, why_infeasible
from autotune.tuning.measure.interval import ValidationSummary
from autotune.tuning.measure.per_device import SERVER_DEVICES_KEY
from autotune.tuning.measure.verdict import Held, held_text

__all__ = [
    "BEST_SCHEMA",
    "best_json",
    "format_recommendation",
    "format_validation",
    "study_hints",
    "validation_block",
]

BEST_SCHEMA = "autotune.study-best/1"


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
        if best is not None and best.interval is not None and not rec.figures:
            lines.append(
                f"  best candidate, trial {best.trial_number}: {what} "
                f"{format_interval(best.interval)}"
            )
    elif v.verdict == "no-baseline":
        lines.append(f"validated: {why} (no gain to give over a config that breaks them)")
    elif v.verdict == "undecided":
        lines.append(f"undecided, no recommendation: {why}")
        if not rec.figures:  # else the validated figures say it, config by config
            lines += _spread(v)
        if best is not None and best.interval is not None and not rec.figures:
            lines.append(
                f"  best candidate, trial {best.trial_number}: {what} "
                f"{format_interval(best.interval)}"
            )
    elif v.verdict == "recommend":
        if best is not None and best.interval is not None:
            fig = next((f for f in rec.figures if f.trial == best.trial_number), None)
            shown = interval_text(fig) if fig is not None else format_interval(best.interval)
            lines.append(f"validated gain in {what}: {shown}")
    else:  # any other verdict, as stored: its name and its reason
        lines.append(f"{v.verdict}, no recommendation: {why}")
    # a broken over-length limit is named in the reason (autotune.tuning.measure.verdict)
    return lines


def validation_block(rec: Recommendation) -> list[str]:
    """Each re-measured config's validated figures (``study best`` and ``study show``,
    under :func:`format_validation`'s verdict); empty before the phase is complete."""
    v = rec.validation
    if v is None or not rec.validated:
        return []
    return validated_lines(rec.figures, v)


def study_hints(rec: Recommendation) -> list[str]:
    """What to weigh and change: on a simulated worker, the simulator's measured error
    (docs/simulator.md#9-accuracy-against-published-measurements); widen the range when the
    recommended config's capacity (validated, else in the study) is at its top
    (autotune.report.bounds)."""
    out = [rec.planning.text()] if rec.planning is not None else []
    return out + _widen_hints(rec)


def _widen_hints(rec: Recommendation) -> list[str]:
    if rec.lattice is None:
        return []
    # the validated capacity when there is one (the median of its runs), else the study's
    n = rec.trial.optuna_trial_number
    fig = next((f for f in rec.figures if f.trial == n and f.capacity is not None), None)
    cap = fig.capacity if fig is not None and rec.validated else rec.capacity()
    hint = widen_hint(cap, rec.lattice.high)
    return [hint] if hint is not None else []


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
        lines = [*format_validation(rec), *validation_block(rec)]
        lines += ["", "the study's best, not validated:"]
    else:
        lines = [rec.command, "", yaml.safe_dump(rec.engine_args, sort_keys=False).rstrip(), ""]
    t, b = rec.trial, rec.baseline
    top = top_level_figures(t)
    lv = t.headline_level()
    # present only when the study searched the parallelism: its figures are per device
    per_device = lv.metrics.get(SERVER_DEVICES_KEY) if lv is not None else None
    devices = int(per_device or 1)
    cap = rec.capacity()
    rps = capacity_rps(t)
    if not t.feasible:
        # the baseline kept on its validation after failing in the study (an over-length
        # cut judged pooled): its validated figures follow, not a "0.0 tok/s"
        why = why_infeasible(t, rec.mode) or "infeasible"
        lines.append(f"trial {t.optuna_trial_number} ({t.stage}): infeasible in the study: {why}")
    else:
        what = f"trial {t.optuna_trial_number} ({t.stage}): {t.objective or 0:,.1f} output tok/s"
        if cap is not None and not cap.exact:
            what += f" at {cap.text()} of the workload's rate"
        elif t.capacity_scale is not None:
            what += f" at {t.capacity_scale:.3f}x the workload's rate"
            if rps is not None:
                what += f" ({rps:,.2f} req/s)"
        lines.append(what)
        if per_device is not None:
            lines.append(
                f"  per device: the study searched the parallelism, so loads and throughputs "
                f"are per device; this config runs on {devices} device(s) "
                "(docs/tuning.md#16-the-parallelism-stage)"
            )
        spread = cap.spread_text() if cap is not None else None
        if spread:  # docs/tuning.md#1-the-capacity-lattice, "Noise"
            lines.append(f"  capacity's spread: {spread}")
    # a per-device capacity: one replica of `devices` serves that many times it
    n = replicas_needed((t.capacity_scale or 0) * devices) if t.feasible else None
    if n is not None and n > 1 and t.capacity_scale is not None:
        full = f" of {rps / t.capacity_scale:,.2f} req/s" if rps is not None else ""
        of = f" of {devices} devices" if devices > 1 else ""
        lines.append(
            f"  one replica{of} serves {100 * t.capacity_scale * devices:.0f} % of the "
            f"workload's traffic ({(rps or 0) * devices:,.2f}{full}): the traffic needs {n} "
            "replicas of this config"
        )
    if top and t.feasible:
        lines.append(
            f"  p99 TTFT {top['p99_ttft_ms']:.1f} ms, p99 TPOT {top['p99_tpot_ms']:.1f} ms"
            if top["p99_ttft_ms"] is not None and top["p99_tpot_ms"] is not None
            else "  (no latency figures)"
        )
    gain = rec.in_study_gain_text(unit="%")
    if b is None:
        lines.append("gain over baseline: n/a (no baseline trial in this study)")
    elif gain is None and rec.validated:
        lines.append(
            f"gain over baseline in the study: none to give (baseline trial "
            f"{b.optuna_trial_number} was infeasible there); the validated figures below "
            "compare the configs"
        )
    elif gain is None:
        lines.append(
            f"gain over baseline: n/a (baseline trial {b.optuna_trial_number} was "
            f"infeasible{': ' + b.failure_class if b.failure_class else ''})"
        )
    elif t is not b:
        lines.append(
            f"gain over baseline (trial {b.optuna_trial_number}, vLLM defaults "
            f"{b.objective:,.1f} tok/s): {gain} in the study (one run each)"
        )
    else:
        lines.append("gain over baseline: none (the best trial is the baseline itself)")
    if not rec.undecided:
        lines += format_validation(rec) + validation_block(rec)
    lines += study_hints(rec)
    return "\n".join(lines)


def best_json(study: str, rec: Recommendation) -> dict[str, Any]:
    """``study best --json``: schema :data:`BEST_SCHEMA`,
    docs/report.md#5-machine-readable-output."""
    t, b = rec.trial, rec.baseline
    top = top_level_figures(t) or {}
    iv = rec.interval
    cap, base_cap = rec.capacity(), rec.capacity(b) if b is not None else None
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
        # the search's status beside the number: "≥" at the top of the range, "<" below it
        "capacity": cap.to_dict() if cap is not None else None,
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
            "capacity": base_cap.to_dict() if base_cap is not None else None,
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
            "in_study_text": rec.in_study_gain_text(),
            "text": gain_text(rec),
        },
        # each re-measured config's validated figures (empty before validation completes)
        "validated": validated_json(rec.figures) if rec.validated else [],
        "hints": study_hints(rec),
        # on a simulated worker, the simulator's measured error (None on `vllm`)
        "planning_error": rec.planning.to_dict() if rec.planning is not None else None,
    }
