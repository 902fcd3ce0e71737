"""The report's plots as plotly figures (needs the ``[report]`` extra: plotly).

Each figure has a stable id: the HTML report's ``<div>`` id and the optuna-dashboard plot's
``graph_object_id`` (docs/report.md#2-the-html-report). Every number comes from stored
records; trials without any measured load level (a worker that never started) cannot be
placed on a latency axis and are named in the figure's subtitle instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import plotly.graph_objects as go

from autotune.report.figure_style import (
    FEASIBLE,
    FRONT,
    INFEASIBLE,
    layout,
    on_log_axis,
    slo_line,
    trial_config,
    trial_list,
    unplaced_note,
)
from autotune.report.load_figures import latency_vs_load_figure, timeline_figure
from autotune.report.study_view import (
    StudyView,
    engine_value_importances,
    pareto_front,
)
from autotune.store import TrialRecord
from autotune.tuning.measure.findings import why_infeasible

__all__ = ["PLOT_IDS", "figures", "importance_figure", "throughput_latency_figure"]

PLOT_IDS = (
    "throughput-vs-ttft",
    "throughput-vs-tpot",
    "latency-vs-load",
    "telemetry-over-time",
    "parameter-importance",
)

log = logging.getLogger(__name__)


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
        if not on_log_axis(x) or not math.isfinite(lv.output_throughput):
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
                    "color": FEASIBLE if ok else INFEASIBLE,
                    "symbol": "circle" if ok else "x",
                    "size": [14 if r[2].optuna_trial_number == rec else 9 for r in rows],
                    "line": {"width": 1, "color": "#333"},
                },
                customdata=[
                    [
                        r[2].optuna_trial_number,
                        r[2].stage,
                        trial_config(r[2]),
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
                line={"shape": "hv", "color": FRONT, "width": 2},
                name="Pareto front (feasible)",
                hoverinfo="skip",
            )
        )
    if slo is not None:
        # a line trace (no markers), named in the legend: annotations on log axes misplace
        ys = [r[1] for ok in (True, False) for r in pts[ok]] or [0.0]
        fig.add_trace(slo_line([slo, slo], [0.0, 1.05 * max(ys)], f"SLO {slo:g} ms"))
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
        f"not on the log axis (0 ms or NaN: nothing completed): {trial_list(off_axis)}"
        if off_axis
        else ""
    )
    return layout(
        fig,
        f"Output throughput vs p99 {name}",
        "; ".join(s for s in (unplaced_note(view.trials, key), skipped) if s)
        or f"{len(view.complete)} completed trials, each at its capacity; infeasible ones "
        "at their lowest load",
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
                marker={"color": FEASIBLE},
                hovertemplate="%{y}: %{x:.3f}<extra></extra>",
            )
        )
        fig.update_xaxes(title="importance (share)", range=[0, 1])
    return layout(
        fig,
        "Parameter importance on engine values",
        f"Optuna's PED-ANOVA over the values passed to vLLM, {n} completed trials",
        height=360,
    )


def _not_drawn(title: str, exc: Exception) -> go.Figure:
    fig = go.Figure()
    why = f"not drawn: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    fig.add_annotation(text=why, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return layout(fig, title, why, height=360)


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
