"""The report's figure style and the small helpers its plots share: the template, the
colours, the title and legend layout, a trial's config label, what a log axis can place, and
the subtitle naming the trials a plot cannot place."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from autotune.report.study_view import ENGINE_KEYS
from autotune.store import TrialRecord

__all__ = [
    "FEASIBLE",
    "FRONT",
    "INFEASIBLE",
    "LINES",
    "SLO",
    "TEMPLATE",
    "finite",
    "layout",
    "on_log_axis",
    "slo_line",
    "trial_config",
    "trial_list",
    "unplaced_note",
]

TEMPLATE = "plotly_white"
FEASIBLE, INFEASIBLE, FRONT, SLO = "#1f77b4", "#d62728", "#2ca02c", "#7f7f7f"
LINES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")


def layout(fig: go.Figure, title: str, subtitle: str = "", height: int = 460) -> go.Figure:
    text = title + (f"<br><sup>{subtitle}</sup>" if subtitle else "")
    fig.update_layout(
        template=TEMPLATE,
        title={"text": text, "x": 0.01, "xanchor": "left"},
        height=height,
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def trial_config(t: TrialRecord) -> str:
    return ", ".join(f"{k}={t.engine_args[k]}" for k in ENGINE_KEYS if k in t.engine_args)


def on_log_axis(v: float | None) -> bool:
    """Whether a log axis can place ``v``: a number above 0. A level where no request
    completed stores latencies of 0 ms (vLLM's zeros for an empty sample,
    autotune.loadgen.bench_stats), and a NaN may come from anywhere."""
    return v is not None and math.isfinite(v) and v > 0


def finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def trial_list(nums: Sequence[int]) -> str:
    return f"trial{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))}"


def unplaced_note(trials: Sequence[TrialRecord], key: str) -> str:
    """Completed trials that have no latency to plot: the worker never served a level, or
    no request completed at the trial's headline level."""
    gone = []
    for t in trials:
        lv = t.headline_level()
        if t.state == "COMPLETE" and (lv is None or getattr(lv, key) is None):
            gone.append(str(t.optuna_trial_number))
    return f"not plotted, no latency measured: trials {', '.join(gone)}" if gone else ""


def slo_line(x: list[float], y: list[float], name: str, **kw: Any) -> go.Scatter:
    return go.Scatter(
        x=x,
        y=y,
        mode="lines",
        name=name,
        line={"dash": "dash", "color": SLO},
        hoverinfo="skip",
        **kw,
    )
