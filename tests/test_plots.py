"""The report's plots on awkward records (docs/report.md#7-after-the-run): latencies of
0 ms (a level where nothing completed), NaN, no levels at all, telemetry series with gaps.
A log axis leaves such points off and its subtitle says which; nothing raises."""

from __future__ import annotations

import logging
import math
from typing import Any

import plotly.graph_objects as go
import pytest
from support.studies import config

from autotune.report import load_figures, plots
from autotune.report.study_view import StudyView, study_view
from autotune.store import LevelRecord, StudyRecord, TrialRecord

NAN = float("nan")


def _level(scale: float, ttft: float | None, tpot: float | None, tok_s: float, ok: bool) -> Any:
    return LevelRecord(
        level_index=0,
        scale=scale,
        offered_rate=4.0 * scale,
        achieved_rate=4.0 * scale,
        completed=0 if tok_s == 0 else 10,
        failed=0,
        over_length=0,
        error_rate=0.0,
        p99_ttft_ms=ttft,
        p99_tpot_ms=tpot,
        p99_itl_ms=None,
        output_throughput=tok_s,
        request_throughput=0.0,
        goodput=None,
        feasible=ok,
        metrics={},
    )


def _trial(number: int, stage: str, levels: list[LevelRecord], objective: float | None) -> Any:
    ok = any(lv.feasible for lv in levels)
    return TrialRecord(
        study_name="t",
        optuna_trial_number=number,
        stage=stage,
        state="COMPLETE",
        params={},
        engine_args={"max_model_len": 2048, "max_num_seqs": 8 * (number + 1)},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
        objective=objective if ok else None,
        feasible=ok,
        capacity_scale=max((lv.scale for lv in levels if lv.feasible), default=None),
        levels=levels,
    )


def _view(trials: list[TrialRecord]) -> StudyView:
    cfg, text = config()
    rec = StudyRecord("t", text, {}, cfg.mode, "sim-virtual", "t")
    return study_view(rec, cfg, trials)


def _good(n: int) -> TrialRecord:
    return _trial(n, "joint", [_level(1.0, 100.0 * n, 20.0, 900.0 + n, True)], 900.0 + n)


def _dead_baseline() -> TrialRecord:
    # the worker died before any request completed: vLLM's zeros for an empty sample
    return _trial(0, "baseline", [_level(0.25, 0.0, 0.0, 0.0, False)], None)


def _points(fig: go.Figure) -> list[tuple[float, float]]:
    return [
        (x, y)
        for tr in fig.data
        if tr.mode == "markers"
        for x, y in zip(tr.x or (), tr.y or (), strict=True)
    ]


def _subtitle(fig: go.Figure) -> str:
    return str(fig.layout.title.text)


def test_a_zero_latency_baseline_is_named_not_placed_on_the_log_axis() -> None:
    view = _view([_dead_baseline(), _good(1), _good(2)])
    fig = plots.throughput_latency_figure(view, "ttft")
    assert sorted(_points(fig)) == [(100.0, 901.0), (200.0, 902.0)]
    assert "not on the log axis (0 ms or NaN: nothing completed): trial 0" in _subtitle(fig)
    # every annotation sits where the log axis can put it (x is log10 of the latency)
    for a in fig.layout.annotations:
        assert math.isfinite(a.x), a
    assert "baseline" not in [a.text for a in fig.layout.annotations]


def test_nan_latency_and_nan_throughput_are_left_off_and_named() -> None:
    nan_x = _trial(3, "joint", [_level(1.0, NAN, 20.0, 800.0, True)], 800.0)
    nan_y = _trial(4, "joint", [_level(1.0, 150.0, 20.0, NAN, True)], 700.0)
    fig = plots.throughput_latency_figure(_view([_good(1), nan_x, nan_y]), "ttft")
    assert _points(fig) == [(100.0, 901.0)]
    assert "trials 3, 4" in _subtitle(fig)


def test_latency_vs_load_skips_zero_and_nan_and_counts_them() -> None:
    base = _trial(
        0,
        "baseline",
        [_level(0.25, 0.0, 0.0, 0.0, False), _level(0.5, 300.0, NAN, 500.0, True)],
        500.0,
    )
    fig = load_figures.latency_vs_load_figure(_view([base, _good(1)]))
    ys = [y for tr in fig.data for y in (tr.y or ())]
    assert ys and all(math.isfinite(y) and y > 0 for y in ys)
    # the baseline at x0.25 (TTFT 0, TPOT 0) and at x0.5 (TPOT NaN): three values left off
    assert "3 point(s) not on the log axes (0 ms or NaN: nothing completed)" in _subtitle(fig)


def test_no_latency_at_all_says_so_and_draws_no_slo_over_an_invented_span() -> None:
    fig = load_figures.latency_vs_load_figure(_view([_dead_baseline()]))
    assert "no latency measured at any load" in _subtitle(fig)
    assert all(len(tr.x or ()) == 0 for tr in fig.data)


def test_empty_study_draws_every_plot() -> None:
    figs = plots.figures(_view([]))
    assert list(figs) == list(plots.PLOT_IDS)
    assert _points(figs["throughput-vs-ttft"]) == []


def test_timeline_gaps_are_gaps() -> None:
    lv = _level(1.0, 100.0, 20.0, 900.0, True)
    lv.telemetry = {
        "series": {
            "t": [0.0, 1.0, 2.0],
            "kv_usage": [0.5, None, NAN],
            "running": [3, NAN, 4],
            "waiting": [],
            "preemptions": [0, 0, NAN],
        }
    }
    view = _view([_trial(0, "baseline", [lv], 900.0)])
    assert view.rec is not None and view.rec.trial.levels[0] is lv
    fig = load_figures.timeline_figure(view)
    by_name = {tr.name: list(tr.y) for tr in fig.data}
    assert by_name["KV usage"] == [50.0, None, None]
    assert by_name["running"] == [3, None, 4]
    assert by_name["preemptions (cumulative)"] == [0, 0, None]
    fig.to_json()  # serialisable as the report writes it


def test_a_plot_that_raises_is_a_box_saying_why_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(view: StudyView) -> go.Figure:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(plots, "timeline_figure", broken)
    with caplog.at_level(logging.WARNING, logger="autotune.report.plots"):
        figs = plots.figures(_view([_good(1)]))
    assert list(figs) == list(plots.PLOT_IDS)
    assert "not drawn: ZeroDivisionError: float division by zero" in _subtitle(
        figs["telemetry-over-time"]
    )
    assert [r.getMessage() for r in caplog.records] == [
        "plot telemetry-over-time not drawn (ZeroDivisionError: float division by zero)"
    ]
