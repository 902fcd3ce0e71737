"""``autotune size --html``: the size table and its Pareto plot in one self-contained page
(docs/sizing.md#5-the-table). Needs the ``[report]`` extra (plotly)."""

from __future__ import annotations

import html
from datetime import UTC, datetime

import plotly.graph_objects as go
import plotly.offline

from autotune.planning.size_table import SizeReport, SizeRow, table_cells
from autotune.report.figure_style import FEASIBLE, FRONT, layout
from autotune.report.html import PAGE_CSS, PLOT_CONFIG

__all__ = ["pareto_figure", "pareto_rows", "render_size_html"]


def pareto_rows(rows: list[SizeRow]) -> list[SizeRow]:
    """The usable rows no other beats on both output tok/s per GPU and tok/s per user."""
    pts = [r for r in rows if r.usable and r.output_tps_per_gpu and r.tps_per_user]

    def beaten(r: SizeRow) -> bool:
        return any(
            (o.output_tps_per_gpu or 0) >= (r.output_tps_per_gpu or 0)
            and (o.tps_per_user or 0) >= (r.tps_per_user or 0)
            and (o.output_tps_per_gpu, o.tps_per_user) != (r.output_tps_per_gpu, r.tps_per_user)
            for o in pts
        )

    return [r for r in pts if not beaten(r)]


def pareto_figure(report: SizeReport) -> go.Figure:
    """Output tok/s per GPU against tok/s per user (what one request streams), one point per
    usable row at the target load; the front is the rows nothing beats on both."""
    pts = [r for r in report.rows if r.usable and r.output_tps_per_gpu and r.tps_per_user]
    front = {id(r) for r in pareto_rows(report.rows)}
    fig = go.Figure()
    for on_front in (False, True):
        sel = [r for r in pts if (id(r) in front) == on_front]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[r.tps_per_user for r in sel],
                y=[r.output_tps_per_gpu for r in sel],
                mode="markers+text",
                text=[f"{r.hardware} TP{r.tensor_parallel_size} x{r.replicas}" for r in sel],
                textposition="top center",
                marker={"size": 11, "color": FRONT if on_front else FEASIBLE},
                name="Pareto front" if on_front else "other rows",
            )
        )
    fig.update_xaxes(title="output tok/s per user (1000 / median TPOT)")
    fig.update_yaxes(title="output tok/s per GPU")
    return layout(fig, "Throughput per GPU against speed per user", f"at {report.target.text}")


def render_size_html(report: SizeReport) -> str:
    """The whole page."""
    head, rows = table_cells(report)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        f'<tr class="{"best" if i == 0 and report.winner else ""}">'
        + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        + "</tr>"
        for i, cells in enumerate(rows)
    )
    w = report.winner
    winner = (
        f"<pre>{html.escape(w.command or '')}</pre>"
        if w is not None
        else "<p>No row meets the SLOs at the target.</p>"
    )
    fig = pareto_figure(report).to_html(
        full_html=False, include_plotlyjs=False, div_id="pareto", config=PLOT_CONFIG
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = html.escape(f"autotune size: {report.config_name} for {report.target.text}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{PAGE_CSS}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        f"</head><body><main><h1>{title}</h1>"
        f'<p class="sub">ranked by {report.ranked_by}; {report.provenance}; generated {when}</p>'
        f'<h2 id="winner">Winner</h2>{winner}'
        f'<h2 id="table">Deployments</h2><div class="wide"><table><thead><tr>{th}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
        f'<h2 id="front">Pareto front</h2><div class="plot">{fig}</div>'
        "</main></body></html>\n"
    )
