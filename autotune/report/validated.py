"""The validated figures of each re-measured config (pure; docs/tuning.md#7-validation): the
baseline's and every candidate's figure over its validation runs (the median; in
slo-capacity mode a capacity with its bounds, autotune.report.bounds), how many of its runs
held the SLOs, and each candidate's gain interval over the baseline. ``study best``,
``study show``, the export and the reports print these, so a baseline that failed in the
study but held in validation shows the capacity it was validated at."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import StudyConfig
from autotune.report.bounds import AT_TOP, BELOW_LOW, Capacity, status_at
from autotune.store import RepeatRecord
from autotune.tuning.measure.interval import Interval, ValidationSummary
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.measure.verdict import Held, held_text

__all__ = [
    "ValidatedConfig",
    "format_interval",
    "interval_text",
    "validated_configs",
    "validated_json",
    "validated_lines",
]


@dataclass(frozen=True)
class ValidatedConfig:
    """One re-measured config: its validated figure and how its runs went."""

    trial: int
    baseline: bool
    held: Held
    capacity: Capacity | None  # slo-capacity: the median capacity with its bound
    median: float | None  # other modes: the median figure over the runs that held
    interval: Interval | None  # a candidate's paired gain over the baseline
    runs_at_top: int = 0  # its runs whose capacity was at the top of the range
    baseline_at_top: int = 0  # the baseline's runs at the top (for the gain's bound)

    @property
    def who(self) -> str:
        return f"baseline, trial {self.trial}" if self.baseline else f"trial {self.trial}"


def _capacity(runs: Sequence[RepeatRecord], cfg: StudyConfig) -> tuple[Capacity | None, int]:
    """The median capacity over a config's runs (the lower median: a measured lattice point
    with its own status) and how many runs reached the top. A run that held at no load is
    below the lowest load; a run whose worker failed says nothing about capacity."""
    lat = lattice_of(cfg)
    rate = cfg.workload.rate
    points: list[tuple[float, str | None]] = []
    for r in runs:
        if r.failure_class is not None:
            continue
        if r.slo_held and r.capacity_scale is not None:
            points.append((r.capacity_scale, status_at(r.capacity_scale, lat)))
        elif not r.slo_held:
            points.append((0.0, BELOW_LOW))
    if not points:
        return None, 0
    points.sort(key=lambda p: p[0])
    scale, status = points[(len(points) - 1) // 2]
    shown = lat.low if status == BELOW_LOW else scale
    rps = shown * rate if rate is not None else None
    return Capacity(shown, rps, status), sum(1 for _, s in points if s == AT_TOP)


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _figure(r: RepeatRecord, mode: str) -> float | None:
    if mode == "offline":
        return r.objective
    return r.worst_margin  # fixed-rate: the worst p99 over its SLO (lower is better)


def validated_configs(
    summary: ValidationSummary | None, repeats: Sequence[RepeatRecord], cfg: StudyConfig
) -> list[ValidatedConfig]:
    """The baseline first, then the candidates in trial order; empty without a summary."""
    if summary is None:
        return []
    done = [r for r in repeats if r.state == "COMPLETE"]

    def runs(trial: int, baseline: bool) -> list[RepeatRecord]:
        return [r for r in done if r.trial_number == trial and (r.role == "baseline") == baseline]

    def one(trial: int, baseline: bool, held: Held, iv: Interval | None) -> ValidatedConfig:
        rs = runs(trial, baseline)
        if summary.mode == "slo-capacity":
            cap, top = _capacity(rs, cfg)
            return ValidatedConfig(trial, baseline, held, cap, None, iv, top)
        figs = [f for r in rs if r.slo_held and (f := _figure(r, summary.mode)) is not None]
        return ValidatedConfig(trial, baseline, held, None, _median(figs), iv)

    base = one(summary.baseline_trial, True, summary.baseline, None)
    out = [base]
    for c in summary.candidates:
        v = one(c.trial_number, False, c.held, c.interval)
        out.append(
            ValidatedConfig(
                v.trial,
                False,
                v.held,
                v.capacity,
                v.median,
                v.interval,
                v.runs_at_top,
                base.runs_at_top,
            )
        )
    return out


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def format_interval(iv: Interval) -> str:
    """E.g. ``+9.4 % (95 % CI +7.1 … +11.8 %, 3 paired runs)``."""
    conf = f"{100 * iv.confidence:.1f}".rstrip("0").rstrip(".")
    runs = f"{iv.n} paired run{'s' if iv.n != 1 else ''}"
    if iv.n < 2:
        return f"{_pct(iv.mean)} ({runs}: no interval; strategy.validate.repeats >= 2 gives one)"
    return f"{_pct(iv.mean)} ({conf} % CI {iv.low:+.1f} … {iv.high:+.1f} %, {runs})"


def interval_text(c: ValidatedConfig) -> str:
    """The candidate's gain interval; a bound when capacities reached the top of the range
    (the candidate's: it may hold more, so the gain is at least this; the baseline's: at
    most)."""
    if c.interval is None:
        return "no gain: no repeat where both it and the baseline held the SLOs"
    text = format_interval(c.interval)
    if c.runs_at_top and c.baseline_at_top:
        return f"{text}, not a bound either way: both reached the top of the range"
    if c.runs_at_top:
        return f"≥ {text} (its capacity reached the top of the range in {c.runs_at_top} runs)"
    if c.baseline_at_top:
        return f"≤ {text} (the baseline reached the top of the range in {c.baseline_at_top} runs)"
    return text


def _figure_text(c: ValidatedConfig, v: ValidationSummary) -> str:
    if c.capacity is not None:
        return f"validated capacity {c.capacity.text()}"
    if v.mode == "slo-capacity":
        return "no validated capacity (every run failed)"
    if c.median is None:
        return f"no validated {v.figure} (it held in no run)"
    if v.mode == "offline":
        return f"validated throughput {c.median:,.1f} output tok/s"
    return f"validated worst p99 over its SLO {c.median:.3f}"


def validated_lines(configs: Sequence[ValidatedConfig], v: ValidationSummary) -> list[str]:
    """One line per config: its validated figure (the median over its runs), runs held of
    runs, and (candidates) its gain's interval over the baseline."""
    if not configs:
        return []
    band = (
        f"; the server's noise band, measured once on the baseline: {v.noise_band_pct:.1f} %"
        if v.noise_band_pct is not None
        else ""
    )
    out = [
        f"validated figures ({v.repeats} validation runs per config; the figure is their "
        f"median, the runs held count its run in the study too{band}):"
    ]
    for c in configs:
        line = f"  {c.who}: the SLOs held {held_text(c.held)}; {_figure_text(c, v)}"
        if not c.baseline:
            line += f"; {v.figure} over the baseline {interval_text(c)}"
        out.append(line)
    return out


def validated_json(configs: Sequence[ValidatedConfig]) -> list[dict[str, Any]]:
    """The same per config for ``--json`` and the export."""
    rows = []
    for c in configs:
        iv = c.interval
        rows.append(
            {
                "trial": c.trial,
                "role": "baseline" if c.baseline else "candidate",
                "capacity": c.capacity.to_dict() if c.capacity is not None else None,
                "median_figure": c.median,
                "runs": c.held.all_runs,
                "runs_held": c.held.all_held,
                "gain": None
                if c.baseline
                else {
                    "interval": iv.to_dict() if iv is not None else None,
                    "bound": "≥"
                    if c.runs_at_top and not c.baseline_at_top
                    else "≤"
                    if c.baseline_at_top and not c.runs_at_top
                    else "",
                    "text": interval_text(c),
                },
            }
        )
    return rows
