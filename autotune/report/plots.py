"""The report's plots as plotly figures (needs the ``[report]`` extra: plotly).

Each figure has a stable id: the HTML report's ``<div>`` id and the optuna-dashboard plot's
``graph_object_id`` (docs/report.md#2-the-html-report). Every number comes from stored
records; trials without any measured load level (a worker that never started) cannot be
placed on a latency axis and are named in the figure's subtitle instead.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autotune.report.recommend import why_infeasible
from autotune.report.summary import (
    ENGINE_KEYS,
    StudyView,
    engine_value_importances,
    pareto_front,
)
from autotune.store import LevelRecord, TrialRecord

__all__ = [
    "PLOT_IDS",
    "figures",
    "importance_figure",
    "latency_vs_load_figure",
    "throughput_latency_figure",
    "timeline_figure",
]

PLOT_IDS = (
    "throughput-vs-ttft",
    "throughput-vs-tpot",
    "latency-vs-load",
    "telemetry-over-time",
    "parameter-importance",
)

log = logging.getLogger(__name__)

_TEMPLATE = "plotly_white"
_FEASIBLE, _INFEASIBLE, _FRONT, _SLO = "#1f77b4", "#d62728", "#2ca02c", "#7f7f7f"
_LINES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")


def _layout(fig: go.Figure, title: str, subtitle: str = "", height: int = 460) -> go.Figure:
    text = title + (f"<br><sup>{subtitle}</sup>" if subtitle else "")
    fig.update_layout(
        template=_TEMPLATE,
        title={"text": text, "x": 0.01, "xanchor": "left"},
        height=height,
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def _config(t: TrialRecord) -> str:
    return ", ".join(f"{k}={t.engine_args[k]}" for k in ENGINE_KEYS if k in t.engine_args)


def _on_log_axis(v: float | None) -> bool:
    """Whether a log axis can place ``v``: a number above 0. A level where no request
    completed stores latencies of 0 ms (vLLM's zeros for an empty sample,
    autotune.loadgen.metrics), and a NaN may come from anywhere."""
    return v is not None and math.isfinite(v) and v > 0


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _trial_list(nums: Sequence[int]) -> str:
    return f"trial{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))}"


def _unplaced(trials: Sequence[TrialRecord], key: str) -> str:
    """Completed trials that have no latency to plot: the worker never served a level, or
    no request completed at the trial's headline level."""
    gone = []
    for t in trials:
        lv = t.headline_level()
        if t.state == "COMPLETE" and (lv is None or getattr(lv, key) is None):
            gone.append(str(t.optuna_trial_number))
    return f"not plotted, no latency measured: trials {', '.join(gone)}" if gone else ""


def throughput_latency_figure(view: StudyView, metric: str) -> go.Figure:
    """Output tok/s against p99 ``metric`` (``ttft`` or ``tpot``): one point per completed
    trial with a measured level, at its capacity (infeasible trials: at their lowest load),
    feasibility marked, the Pareto front of the feasible ones, the SLO as a line."""
    key, label = (
        ("p99_ttft_ms", "p99 TTFT (ms)") if metric == "ttft" else ("p99_tpot_ms", "p99 TPOT (ms)")
    )
    slo = view.cfg.slo.p99_ttft_ms if metric == "ttft" else view.cfg.slo.p99_tpot_ms
    rec = view.rec.trial.optuna_trial_number if view.rec is not None else None
    pts: dict[bool, list[tuple[float, float, TrialRecord]]] = {True: [], False: []}
    off_axis: list[int] = []
    for t in view.complete:
        lv = t.headline_level()
        x = getattr(lv, key) if lv is not None else None
        if lv is None or x is None:
            continue  # named in the subtitle
        if not _on_log_axis(x) or not math.isfinite(lv.output_throughput):
            off_axis.append(t.optuna_trial_number)  # named in the subtitle
            continue
        pts[bool(t.feasible)].append((x, lv.output_throughput, t))
    fig = go.Figure()
    for ok in (True, False):
        rows = pts[ok]
        fig.add_trace(
            go.Scatter(
                x=[r[0] for r in rows],
                y=[r[1] for r in rows],
                mode="markers",
                name="feasible (at capacity)" if ok else "infeasible (at lowest load)",
                marker={
                    "color": _FEASIBLE if ok else _INFEASIBLE,
                    "symbol": "circle" if ok else "x",
                    "size": [14 if r[2].optuna_trial_number == rec else 9 for r in rows],
                    "line": {"width": 1, "color": "#333"},
                },
                customdata=[
                    [
                        r[2].optuna_trial_number,
                        r[2].stage,
                        _config(r[2]),
                        why_infeasible(r[2], view.cfg.mode) or "feasible",
                    ]
                    for r in rows
                ],
                hovertemplate="trial %{customdata[0]} (%{customdata[1]})<br>%{customdata[2]}"
                "<br>%{y:,.1f} tok/s, " + label + " %{x:,.1f}<br>%{customdata[3]}<extra></extra>",
            )
        )
    front = pareto_front([(r[0], r[1], r[2].optuna_trial_number) for r in pts[True]])
    if len(front) > 1:
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in front],
                y=[p[1] for p in front],
                mode="lines",
                line={"shape": "hv", "color": _FRONT, "width": 2},
                name="Pareto front (feasible)",
                hoverinfo="skip",
            )
        )
    if slo is not None:
        # a line trace (no markers), named in the legend: annotations on log axes misplace
        ys = [r[1] for ok in (True, False) for r in pts[ok]] or [0.0]
        fig.add_trace(_slo_line([slo, slo], [0.0, 1.05 * max(ys)], f"SLO {slo:g} ms"))
    if rec is not None:
        for ok in (True, False):
            for x, y, t in pts[ok]:
                if t.optuna_trial_number == rec:
                    # annotations on a log axis take the log of the position
                    fig.add_annotation(
                        x=math.log10(x), y=y, text=f"recommended (trial {rec})", ay=-35
                    )
    base = view.baseline
    for ok in (True, False):
        for x, y, t in pts[ok]:
            if base is not None and t is base and t.optuna_trial_number != rec:
                fig.add_annotation(x=math.log10(x), y=y, text="baseline", ay=35)
    fig.update_xaxes(title=label, type="log")
    fig.update_yaxes(title="output tok/s")
    name = "TTFT" if metric == "ttft" else "TPOT"
    skipped = (
        f"not on the log axis (0 ms or NaN: nothing completed): {_trial_list(off_axis)}"
        if off_axis
        else ""
    )
    return _layout(
        fig,
        f"Output throughput vs p99 {name}",
        "; ".join(s for s in (_unplaced(view.trials, key), skipped) if s)
        or f"{len(view.complete)} completed trials, each at its capacity; infeasible ones "
        "at their lowest load",
    )


def _slo_line(x: list[float], y: list[float], name: str, **kw: Any) -> go.Scatter:
    return go.Scatter(
        x=x,
        y=y,
        mode="lines",
        name=name,
        line={"dash": "dash", "color": _SLO},
        hoverinfo="skip",
        **kw,
    )


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
        color = _LINES[i % len(_LINES)]
        for col, key in ((1, "p99_ttft_ms"), (2, "p99_tpot_ms")):
            xs, ys, lo, hi = [], [], [], []
            for rate, lvs in _by_rate(group):
                got = [getattr(lv, key) for lv in lvs if getattr(lv, key) is not None]
                # both x axes are log, and the TTFT axis too: 0 ms (nothing completed) and
                # NaN cannot be placed; the subtitle counts them
                vals = [v for v in got if _on_log_axis(v)] if _on_log_axis(rate) else []
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
                _slo_line(span, [slo, slo], f"SLO {slo:g} ms", legendgroup=f"slo{col}"),
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
    return _layout(fig, "Latency vs offered load: the baseline and the best configs", sub)


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
        return _layout(fig, "Server state over time", why, height=620)
    t = series["t"]
    if "kv_usage" in series:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[100 * v if (v := _finite(u)) is not None else None for u in series["kv_usage"]],
                name="KV usage",
                mode="lines",
            ),
            row=1,
            col=1,
        )
    for name, color in (("running", _LINES[0]), ("waiting", _LINES[1])):
        if name in series:
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=[_finite(v) for v in series[name]],
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
                y=[_finite(v) for v in series["preemptions"]],
                name="preemptions (cumulative)",
                mode="lines",
                line={"color": _INFEASIBLE, "shape": "hv"},
            ),
            row=3,
            col=1,
        )
    fig.update_xaxes(title="seconds into the level", row=3, col=1)
    rate = f" ({lv.offered_rate:,.2f} req/s)" if lv.offered_rate is not None else ""
    return _layout(
        fig,
        f"Server state over time: trial {rec.trial.optuna_trial_number} at its capacity "
        f"x{lv.scale:.3f}{rate}",
        f"{len(t)} bins of the level's gauge samples (bin means); preemptions counted "
        "from the level's start",
        height=620,
    )


def importance_figure(view: StudyView) -> go.Figure:
    """Importance of each engine arg for the objective (PED-ANOVA on engine values)."""
    imp = engine_value_importances(view.trials)
    fig = go.Figure()
    n = sum(1 for t in view.complete if t.objective is not None)
    if not imp:
        fig.add_annotation(
            text="too few completed trials with varied engine values",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    else:
        names = [k for k, _ in reversed(imp)]
        fig.add_trace(
            go.Bar(
                x=[v for _, v in reversed(imp)],
                y=names,
                orientation="h",
                marker={"color": _FEASIBLE},
                hovertemplate="%{y}: %{x:.3f}<extra></extra>",
            )
        )
        fig.update_xaxes(title="importance (share)", range=[0, 1])
    return _layout(
        fig,
        "Parameter importance on engine values",
        f"Optuna's PED-ANOVA over the values passed to vLLM, {n} completed trials",
        height=360,
    )


def _not_drawn(title: str, exc: Exception) -> go.Figure:
    fig = go.Figure()
    why = f"not drawn: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    fig.add_annotation(text=why, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return _layout(fig, title, why, height=360)


def figures(view: StudyView) -> dict[str, go.Figure]:
    """Every plot of the report, by id (:data:`PLOT_IDS`). A plot that cannot be drawn is
    a box saying why and one warning: the report and the run's end go on
    (docs/report.md#7-after-the-run)."""
    build: dict[str, tuple[str, Callable[[], go.Figure]]] = {
        "throughput-vs-ttft": (
            "Output throughput vs p99 TTFT",
            lambda: throughput_latency_figure(view, "ttft"),
        ),
        "throughput-vs-tpot": (
            "Output throughput vs p99 TPOT",
            lambda: throughput_latency_figure(view, "tpot"),
        ),
        "latency-vs-load": ("Latency vs offered load", lambda: latency_vs_load_figure(view)),
        "telemetry-over-time": ("Server state over time", lambda: timeline_figure(view)),
        "parameter-importance": ("Parameter importance", lambda: importance_figure(view)),
    }
    assert tuple(build) == PLOT_IDS
    figs: dict[str, go.Figure] = {}
    for fid, (title, draw) in build.items():
        try:
            figs[fid] = draw()
        except Exception as exc:
            log.warning("plot %s not drawn (%s: %s)", fid, type(exc).__name__, exc)
            log.debug("plot %s not drawn", fid, exc_info=True)
            figs[fid] = _not_drawn(title, exc)
    return figs
