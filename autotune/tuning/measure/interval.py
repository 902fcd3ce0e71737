"""Noise-aware comparison of re-measured configs (pure; docs/tuning.md#7-validation).

The validation phase re-measures the study's top configs and the baseline on fresh workload
samples with fresh jitter. Runs of one repeat share their workload sample, so each candidate
gets one *paired* gain per repeat, ``100 * (figure / baseline figure - 1)``, and a Student
t-interval of the mean paired gain. The per-pair standard deviation is floored (at one
step of a run's lattice by default): capacities sit on the lattice, so paired differences can
be exactly equal and a zero-width interval would claim certainty the lattice cannot give.

The verdict (:mod:`autotune.tuning.measure.verdict`) holds every config, the baseline included, to
one bar: the latency and error SLOs held in every run, its run in the study counted as one;
the over-length limit is judged on a config's repeats together (requests cut over requests
sent), because how many requests ``max_model_len`` cuts depends on the lengths drawn, not on
load or noise, and the pooled rate estimates it better than any one sample does.

Figures per mode (higher is better): ``slo-capacity`` the SLO capacity (load scale),
``offline`` output throughput, ``fixed-rate`` the worst SLO margin's headroom
``1 / worst_slo_margin`` (so a gain of +25 % means the worst p99 sits 20 % further below its
SLO than the baseline's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autotune.config import StudyConfig
from autotune.store.records import RepeatRecord, TrialRecord
from autotune.tuning.measure.noise import NoiseRecord
from autotune.tuning.measure.tdist import t_quantile, t_two_sided
from autotune.tuning.measure.validation_plan import run_resolution
from autotune.tuning.measure.verdict import Contender, Held, Verdict, held_in_study, verdict_of

__all__ = [
    "FIGURE_NAMES",
    "CandidateSummary",
    "Interval",
    "Run",
    "ValidationSummary",
    "Verdict",
    "candidate_rank",
    "figure_of",
    "paired_interval",
    "runs_of",
    "summarize",
    "summary_of",
    "t_quantile",
    "t_two_sided",
]

FIGURE_NAMES = {
    "slo-capacity": "SLO capacity",
    "offline": "throughput",
    "fixed-rate": "worst SLO margin",
}


@dataclass(frozen=True)
class Interval:
    """A t-interval of the mean paired gain (percent). With fewer than two pairs it is
    unbounded (``low = -inf``, ``high = +inf``): one run says nothing about noise."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float
    sd: float  # the sample standard deviation of the paired gains (0 for one pair)
    sd_used: float  # after the floor

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("low", "high"):
            if not math.isfinite(d[k]):
                d[k] = None  # JSON has no infinity
        return d


def paired_interval(gains: Sequence[float], confidence: float, sd_floor: float) -> Interval:
    """The t-interval of the mean of ``gains`` at ``confidence``, its standard deviation
    floored at ``sd_floor`` (> 0) so that it never has zero width."""
    if not gains:
        raise ValueError("no paired gains")
    if not sd_floor > 0:
        raise ValueError(f"sd_floor must be > 0, got {sd_floor}")
    n = len(gains)
    mean = statistics.fmean(gains)
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n, confidence, 0.0, sd_floor)
    sd = statistics.stdev(gains)
    used = max(sd, sd_floor)
    half = t_quantile(confidence, n - 1) * used / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, confidence, sd, used)


def figure_of(
    mode: str,
    *,
    capacity_scale: float | None,
    objective: float | None,
    worst_margin: float | None,
) -> float | None:
    """A run's figure for the mode's gain (higher is better); None when it has none."""
    if mode == "slo-capacity":
        return capacity_scale if capacity_scale is not None and capacity_scale > 0 else None
    if mode == "offline":
        return objective if objective is not None and objective > 0 else None
    if worst_margin is None or not worst_margin > 0 or not math.isfinite(worst_margin):
        return None
    return 1.0 / worst_margin


@dataclass(frozen=True)
class Run:
    """One finished validation run, as the decision needs it."""

    repeat: int
    trial_number: int
    baseline: bool
    slo_held: bool  # the latency and error SLOs (over-length is judged pooled)
    figure: float | None  # figure_of(...); None when the SLOs did not hold or it failed
    overlength_rate: float | None = None  # of ``requests`` (None: nothing was sent)
    requests: int = 0


@dataclass(frozen=True)
class CandidateSummary:
    trial_number: int
    runs: int  # finished runs
    slo_held: int  # of which the SLOs held
    mean_figure: float | None
    interval: Interval | None  # None: no repeat where both it and the baseline held
    overlength_rate: float | None = None  # pooled over its runs
    overlength_ok: bool = True  # the pooled rate is within the limit
    study_held: bool | None = None  # its run in the study held its SLOs (None: not known)
    figure_range: tuple[float, float] | None = None  # over the runs that held

    @property
    def held(self) -> Held:
        return Held(
            self.runs, self.slo_held, self.study_held, self.overlength_rate, self.overlength_ok
        )

    @property
    def eligible(self) -> bool:
        """Its SLOs held in every run, the study's included (over-length: pooled)."""
        return self.held.every

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_number": self.trial_number,
            "runs": self.runs,
            "slo_held": self.slo_held,
            "study_held": self.study_held,
            "figure_range": list(self.figure_range) if self.figure_range else None,
            "overlength_rate": self.overlength_rate,
            "overlength_ok": self.overlength_ok,
            "eligible": self.eligible,
            "mean_figure": self.mean_figure,
            "interval": self.interval.to_dict() if self.interval is not None else None,
        }


@dataclass(frozen=True)
class ValidationSummary:
    mode: str
    figure: str  # FIGURE_NAMES[mode]
    confidence: float
    repeats: int  # planned repeats per config
    runs_done: int
    runs_planned: int
    baseline_trial: int
    baseline_held: int  # repeats in which the baseline met its latency and error SLOs
    baseline_overlength_rate: float | None
    baseline_overlength_ok: bool
    max_overlength_rate: float
    candidates: tuple[CandidateSummary, ...]
    verdict: Verdict | None  # None while runs are missing
    chosen: int | None  # the recommended trial (None: keep, undecided, or incomplete)
    best: int | None  # the candidate with the best lower bound: the interval reported
    reason: str | None = None  # why the verdict (autotune.tuning.measure.verdict)
    baseline_runs: int = 0  # its finished validation runs
    baseline_study_held: bool | None = None  # its run in the study held (None: not known)
    baseline_figure_range: tuple[float, float] | None = None
    noise_band_pct: float | None = None  # the server's noise band (None: not measured)

    @property
    def complete(self) -> bool:
        return self.runs_done >= self.runs_planned

    @property
    def baseline(self) -> Held:
        return Held(
            self.baseline_runs,
            self.baseline_held,
            self.baseline_study_held,
            self.baseline_overlength_rate,
            self.baseline_overlength_ok,
        )

    @property
    def baseline_ok(self) -> bool:
        """The baseline held its SLOs in every run, the study's included."""
        return self.baseline.every

    def candidate(self, trial_number: int | None) -> CandidateSummary | None:
        return next((c for c in self.candidates if c.trial_number == trial_number), None)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "candidates"}
        d["candidates"] = [c.to_dict() for c in self.candidates]
        d["complete"] = self.complete
        return d


def candidate_rank(c: CandidateSummary) -> tuple[float, float, float]:
    """A validated candidate's sort key, the larger the better: its interval's low end, then
    its mean, then its mean figure (no interval ranks below any interval)."""
    iv = c.interval
    return (
        iv.low if iv is not None else -math.inf,
        iv.mean if iv is not None else -math.inf,
        c.mean_figure if c.mean_figure is not None else -math.inf,
    )


def _pooled(runs: Sequence[Run]) -> float | None:
    sent = sum(r.requests for r in runs if r.overlength_rate is not None)
    if sent == 0:
        return None
    cut = sum(r.overlength_rate * r.requests for r in runs if r.overlength_rate is not None)
    return cut / sent


def summarize(
    runs: Sequence[Run],
    *,
    mode: str,
    baseline_trial: int,
    repeats: int,
    runs_planned: int,
    confidence: float,
    sd_floor: float,
    max_overlength_rate: float,
    study_held: Mapping[int, bool] | None = None,
    noise: NoiseRecord | None = None,
) -> ValidationSummary:
    """Per-candidate paired intervals and the verdict (:func:`verdict_of`). Pairs are formed
    per repeat from the runs where both the candidate and the baseline met their SLOs.
    ``study_held`` maps a trial number to whether its run in the study held its SLOs: that
    run counts as one of the config's runs, for the baseline as for the candidates."""
    in_study = study_held or {}
    limit = max_overlength_rate + 1e-12

    def ok(rate: float | None) -> bool:
        return rate is None or rate <= limit

    base_runs = [r for r in runs if r.baseline]
    base_ol = _pooled(base_runs)
    base: Mapping[int, float | None] = {
        r.repeat: r.figure if r.slo_held else None for r in base_runs
    }
    base_held = sum(1 for r in base_runs if r.slo_held and r.figure is not None)
    by: dict[int, list[Run]] = {}
    for r in runs:
        if not r.baseline:
            by.setdefault(r.trial_number, []).append(r)
    cands = []
    for number, rs in by.items():
        gains = []
        for r in rs:
            b = base.get(r.repeat)
            if r.slo_held and r.figure is not None and b is not None and b > 0:
                gains.append(100.0 * (r.figure / b - 1.0))
        figs = [r.figure for r in rs if r.slo_held and r.figure is not None]
        ol = _pooled(rs)
        cands.append(
            CandidateSummary(
                number,
                len(rs),
                sum(1 for r in rs if r.slo_held),
                statistics.fmean(figs) if figs else None,
                paired_interval(gains, confidence, sd_floor) if gains else None,
                ol,
                ok(ol),
                in_study.get(number),
                (min(figs), max(figs)) if figs else None,
            )
        )
    cands.sort(key=lambda c: c.trial_number)
    done = len(runs)
    base_figs = [f for f in base.values() if f is not None]
    held = Held(len(base_runs), base_held, in_study.get(baseline_trial), base_ol, ok(base_ol))
    verdict, chosen, best, reason = verdict_of(
        held,
        [
            Contender(
                c.trial_number,
                c.held,
                c.interval.low if c.interval else None,
                c.mean_figure,
                *((c.interval.mean, c.interval.high, c.interval.n) if c.interval else ()),
            )
            for c in sorted(cands, key=candidate_rank, reverse=True)
        ],
        complete=done >= runs_planned,
        max_overlength_rate=max_overlength_rate,
        noise=noise,
    )
    return ValidationSummary(
        mode=mode,
        figure=FIGURE_NAMES.get(mode, mode),
        confidence=confidence,
        repeats=repeats,
        runs_done=done,
        runs_planned=runs_planned,
        baseline_trial=baseline_trial,
        baseline_held=base_held,
        baseline_overlength_rate=base_ol,
        baseline_overlength_ok=ok(base_ol),
        max_overlength_rate=max_overlength_rate,
        candidates=tuple(cands),
        verdict=verdict,
        chosen=chosen,
        best=best,
        reason=reason,
        baseline_runs=len(base_runs),
        baseline_study_held=held.study,
        baseline_figure_range=(min(base_figs), max(base_figs)) if base_figs else None,
        noise_band_pct=noise.band_pct if noise is not None else None,
    )


def runs_of(mode: str, repeats: Sequence[RepeatRecord]) -> list[Run]:
    """The finished ``repeats`` as the decision sees them: each with the mode's figure
    (:func:`figure_of`) when its SLOs held."""
    return [
        Run(
            r.repeat_index,
            r.trial_number,
            r.role == "baseline",
            bool(r.slo_held),
            figure_of(
                mode,
                capacity_scale=r.capacity_scale,
                objective=r.objective,
                worst_margin=r.worst_margin,
            )
            if r.slo_held
            else None,
            r.overlength_rate,
            r.requests,
        )
        for r in repeats
        if r.state == "COMPLETE"
    ]


def summary_of(
    cfg: StudyConfig,
    repeats: Sequence[RepeatRecord],
    trials: Sequence[TrialRecord] | None = None,
    noise: NoiseRecord | None = None,
    confidence: float | None = None,
) -> ValidationSummary | None:
    """The paired intervals and verdict of a study's stored runs (None: no plan); with the
    study's ``trials``, each config's run in the study counts as one of its runs; with the
    server's ``noise`` (the study attribute), gains inside its band are too noisy to tell.
    ``confidence``: another than the study's (the early look's, docs/tuning.md#7-validation)."""
    if not repeats:
        return None
    base = next((r.trial_number for r in repeats if r.role == "baseline"), -1)
    runs = runs_of(cfg.mode, repeats)
    v = cfg.strategy.validate_
    return summarize(
        runs,
        mode=cfg.mode,
        baseline_trial=base,
        repeats=max(r.repeat_index for r in repeats) + 1,
        runs_planned=len(repeats),
        confidence=v.confidence if confidence is None else confidence,
        # one step of a run's lattice, in percent: the finest gain its runs resolve (one
        # study step in the one-level modes, whose runs measure no lattice)
        sd_floor=100.0
        * (run_resolution(cfg) if cfg.mode == "slo-capacity" else cfg.strategy.capacity_resolution),
        max_overlength_rate=cfg.slo.max_overlength_rate,
        study_held={
            t.optuna_trial_number: held_in_study(t)
            for t in trials or ()
            if t.state == "COMPLETE"
            and any(r.trial_number == t.optuna_trial_number for r in repeats)
        },
        noise=noise,
    )
