"""The report's plots of load and time: latency against the offered load for the baseline
and the best configs, and the server's state over the recommended config's capacity level
(docs/report.md#2-the-html-report)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autotune.report.figure_style import (
    INFEASIBLE,
    LINES,
    finite,
    layout,
    on_log_axis,
    slo_line,
)
from autotune.report.study_view import StudyView
from autotune.store import LevelRecord, TrialRecord

__all__ = ["latency_vs_load_figure", "timeline_figure"]


def _distinct_top(view: StudyView, n: int) -> list[tuple[str, list[TrialRecord]]]:
    """The baseline and the ``n`` best distinct feasible configs, each with every trial that
    ran exactly that config (repeats give intervals)."""
    groups: dict[str, list[TrialRecord]] = defaultdict(list)
    for t in view.complete:
        if t.levels:
            groups[repr(sorted(t.engine_args.items()))].append(t)
    ranked = sorted(
        (g for g in groups.values() if any(t.feasible for t in g)),
        key=lambda g: -max((t.objective or 0.0) for t in g if t.feasible),
    )
    out: list[tuple[str, list[TrialRecord]]] = []
    base = view.baseline
    if base is not None and base.levels:
        out.append(("baseline", groups[repr(sorted(base.engine_args.items()))]))
    for g in ranked:
        if len(out) >= n + (1 if base is not None else 0):
            break
        if base is not None and base in g:
            continue
        nums = "/".join(str(t.optuna_trial_number) for t in g)
        out.append((f"trial {nums}", g))
    return out


def _by_rate(trials: Sequence[TrialRecord]) -> list[tuple[float, list[LevelRecord]]]:
    at: dict[float, list[LevelRecord]] = defaultdict(list)
    for t in trials:
        for lv in t.levels:
            rate = lv.offered_rate if lv.offered_rate is not None else lv.scale
            at[round(rate, 6)].append(lv)
    return sorted(at.items())


def latency_vs_load_figure(view: StudyView, top: int = 3) -> go.Figure:
    """p99 TTFT and p99 TPOT against the offered load for the baseline and the best configs,
    the SLOs as lines; where a config was measured more than once at a load (repeated
    trials), the point is the mean and the bar spans the measurements."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("p99 TTFT", "p99 TPOT"), horizontal_spacing=0.1
    )
    repeats = skipped = 0
    rates: list[float] = []
    for i, (label, group) in enumerate(_distinct_top(view, top)):
        color = LINES[i % len(LINES)]
        for col, key in ((1, "p99_ttft_ms"), (2, "p99_tpot_ms")):
            xs, ys, lo, hi = [], [], [], []
            for rate, lvs in _by_rate(group):
                got = [getattr(lv, key) for lv in lvs if getattr(lv, key) is not None]
                # both x axes are log, and the TTFT axis too: 0 ms (nothing completed) and
                # NaN cannot be placed; the subtitle counts them
                vals = [v for v in got if on_log_axis(v)] if on_log_axis(rate) else []
                skipped += len(got) - len(vals)
                if not vals:
                    continue
                mean = sum(vals) / len(vals)
                rates.append(rate)
                xs.append(rate)
                ys.append(mean)
                lo.append(mean - min(vals))
                hi.append(max(vals) - mean)
                repeats += len(vals) > 1
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines+markers",
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    line={"color": color},
                    error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": any(hi)},
                    hovertemplate=f"{label}<br>%{{x:,.2f}} req/s: %{{y:,.1f}} ms<extra></extra>",
                ),
                row=1,
                col=col,
            )
    for col, slo in ((1, view.cfg.slo.p99_ttft_ms), (2, view.cfg.slo.p99_tpot_ms)):
        if slo is not None and rates:  # no point, no load span to draw the SLO over
            span = [min(rates), max(rates)]
            fig.add_trace(
                slo_line(span, [slo, slo], f"SLO {slo:g} ms", legendgroup=f"slo{col}"),
                row=1,
                col=col,
            )
    unit = "req/s" if view.cfg.workload.rate is not None else "x load"
    fig.update_xaxes(title=f"offered load ({unit})", type="log")
    fig.update_yaxes(title="ms", type="log", row=1, col=1)
    fig.update_yaxes(title="ms", row=1, col=2)
    sub = (
        "bars span repeated measurements of one config at one load"
        if repeats
        else "one measurement per config and load (no repeats, so no intervals)"
    )
    if not rates:
        sub = "no latency measured at any load"
        fig.add_annotation(text=sub, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    elif skipped:
        sub += f"; {skipped} point(s) not on the log axes (0 ms or NaN: nothing completed)"
    return layout(fig, "Latency vs offered load: the baseline and the best configs", sub)


def timeline_figure(view: StudyView) -> go.Figure:
    """KV-cache usage, running and waiting requests, and preemptions over the time of the
    recommended config's capacity level (bin means of the server's gauges)."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=("KV-cache usage (%)", "requests running / waiting", "preemptions"),
    )
    rec = view.rec
    series: dict[str, Any] | None = None
    lv = rec.trial.headline_level() if rec is not None else None
    if lv is not None and lv.telemetry:
        series = lv.telemetry.get("series")
    if rec is None or lv is None or not series or not series.get("t"):
        why = (
            "no recommendation yet"
            if rec is None
            else "no time series stored for this level (Prometheus telemetry, or a study "
            "run by an older autotune)"
        )
        fig.add_annotation(text=why, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        return layout(fig, "Server state over time", why, height=620)
    t = series["t"]
    if "kv_usage" in series:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[100 * v if (v := finite(u)) is not None else None for u in series["kv_usage"]],
                name="KV usage",
                mode="lines",
            ),
            row=1,
            col=1,
        )
    for name, color in (("running", LINES[0]), ("waiting", LINES[1])):
        if name in series:
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=[finite(v) for v in series[name]],
                    name=name,
                    mode="lines",
                    line={"color": color},
                ),
                row=2,
                col=1,
            )
    if "preemptions" in series:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[finite(v) for v in series["preemptions"]],
                name="preemptions (cumulative)",
                mode="lines",
                line={"color": INFEASIBLE, "shape": "hv"},
            ),
            row=3,
            col=1,
        )
    fig.update_xaxes(title="seconds into the level", row=3, col=1)
    rate = f" ({lv.offered_rate:,.2f} req/s)" if lv.offered_rate is not None else ""
    return layout(
        fig,
        f"Server state over time: trial {rec.trial.optuna_trial_number} at its capacity "
        f"x{lv.scale:.3f}{rate}",
        f"{len(t)} bins of the level's gauge samples (bin means); preemptions counted "
        "from the level's start",
        height=620,
    )
