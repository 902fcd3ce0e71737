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

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.config import StudyConfig
from autotune.redact import mask_argv
from autotune.report.bounds import Capacity, gain_bound_text, trial_capacity
from autotune.report.validated import (
    ValidatedConfig,
    format_interval,
    interval_text,
    validated_configs,
)
from autotune.sim import PlanningError, planning_error
from autotune.store import RepeatRecord, TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.findings import record_stopped, why_infeasible
from autotune.tuning.measure.interval import Interval, ValidationSummary, summary_of
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.measure.noise import NoiseRecord
from autotune.tuning.measure.scoring import Slo, record_rank
from autotune.workers.vllm_command import deploy_argv, format_command

__all__ = [
    "Recommendation",
    "format_interval",
    "gain_text",
    "no_feasible_reason",
    "planning_of",
    "recommend",
    "replicas_needed",
    "top_level_figures",
]


# the verdicts that name a config to run: a candidate, or the baseline ("keep")
_PICKS = ("recommend", "keep", "no-baseline")


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
    mode: str = "slo-capacity"
    lattice: Lattice | None = None  # the study's capacity lattice (its bounds: report.bounds)
    # each re-measured config's validated figures (autotune.report.validated)
    figures: list[ValidatedConfig] = field(default_factory=list)
    # planned on a simulated worker: the simulator's measured error (None on `vllm`)
    planning: PlanningError | None = None

    def capacity(self, t: TrialRecord | None = None) -> Capacity | None:
        """A trial's capacity as shown, with its bound (default: the recommended trial)."""
        t = self.trial if t is None else t
        return trial_capacity(t, self.lattice, self.mode)

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
        """The validation's verdict names no config to run: no config held its SLOs in
        every run ("undecided"), or any other verdict that picks neither a candidate nor the
        baseline (docs/tuning.md#7-validation). Nothing to recommend, no command to print."""
        v = self.validation
        return self.validated and v is not None and v.verdict not in _PICKS

    def in_study_gain_text(self, unit: str = " %") -> str | None:
        """The in-study gain with its bounds (``≥ +12.3 %`` when the best trial's capacity is
        at the top of the range); None when there is none."""
        gain = self.gain_pct
        if gain is None or self.baseline is None:
            return None
        cand, base = self.capacity(), self.capacity(self.baseline)
        return gain_bound_text(
            gain, cand.status if cand else None, base.status if base else None, unit
        )

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
    if rec.undecided and v is not None:
        return f"{v.verdict}: {why}"
    if rec.validated and iv is not None:
        c = next((f for f in rec.figures if not f.baseline and f.interval is iv), None)
        return interval_text(c) if c is not None else format_interval(iv)
    gain = rec.gain_pct
    if b is None:
        return "n/a (no baseline trial in this study)"
    if gain is None:
        why = f": {b.failure_class}" if b.failure_class else ""
        return f"n/a (baseline trial {b.optuna_trial_number} was infeasible{why})"
    return f"{rec.in_study_gain_text() or f'{gain:+.1f} %'} (not validated)"


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


def top_level_figures(t: TrialRecord) -> dict[str, Any] | None:
    """The headline level's figures (a stopped level's: only what it measured), or None
    when the trial measured no level."""
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
    cfg: StudyConfig,
    trials: list[TrialRecord],
    repeats: list[RepeatRecord] | None = None,
    noise: NoiseRecord | None = None,
) -> Recommendation | None:
    """The recommendation from the stored trials and, when given and complete, the
    validation runs (``Store.repeats``), judged against the server's ``noise``
    (``study_attrs.stored_noise``) as the validation phase judged them."""
    done = [t for t in trials if t.state == "COMPLETE"]
    feasible = [t for t in done if t.feasible and t.objective is not None]
    baseline = next((t for t in done if t.stage == "baseline"), None)
    summary = summary_of(cfg, repeats or [], trials, noise)
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
    argv = deploy_argv(
        cfg.model.name,
        best.engine_args,
        static_args=cfg.worker.static_args,
        served_model_name=cfg.model.served_name,
    )
    return Recommendation(
        best,
        baseline,
        format_command(argv),
        dict(best.engine_args),
        mask_argv(argv),
        summary,
        cfg.strategy.validate_.enabled,
        cfg.mode,
        lattice_of(cfg),
        validated_configs(summary, repeats or [], cfg) if summary is not None else [],
        planning_of(cfg),
    )


def planning_of(cfg: StudyConfig) -> PlanningError | None:
    """What a study on a simulated worker states about the simulator's error
    (docs/simulator.md#9-accuracy-against-published-measurements); None on a real one."""
    return None if cfg.worker.kind == "vllm" else planning_error(cfg.hardware)
