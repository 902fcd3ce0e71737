"""What a level the early-stop rule ended shows (docs/tuning.md#10-early-stop-inside-a-level):
a rate violation only once the requests sent make it certain, figures over no finished
request as not measured, lower bounds labelled as such, the reason and the request it
stopped at, and "stopped early" only when requests were still to be sent; in the progress
line, ``study show``, the exports and the report."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rich.console import Console

from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.level import LevelMetrics, overlength_rate
from autotune.loadgen.stop_rule import stopped_summary
from autotune.loadgen.stopped import StopInfo, certain_rate
from autotune.report.levels import figure_cell, progress_figures, record_stopped
from autotune.report.notes import trial_note
from autotune.report.study_export import export_csv, export_json
from autotune.report.tables import show_rows, show_table
from autotune.store import LevelRecord, StudyRecord, TrialRecord
from autotune.tuning.measure.findings import why_infeasible
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.scoring import Slo, score_level
from autotune.tuning.measure.trial import level_record

SLO_MS = 3000.0


def _records(ok: int, refused: int, truncated: int, errors: int) -> list[RequestRecord]:
    """Finished requests: ``ok`` successes (``truncated`` of them cut by max_model_len, TTFT
    1 s), ``refused`` over-length 400s and ``errors`` failures."""
    recs = [
        RequestRecord(
            f"r{i}",
            success=True,
            output_tokens=4,
            sent_at=0.0,
            ttft=1.0,
            e2el=1.3,
            finished_at=1.3,
            truncated=i < truncated,
        )
        for i in range(ok)
    ]
    recs += [
        RequestRecord(f"o{i}", error="over_length: x", sent_at=0.0, over_length=True)
        for i in range(refused)
    ]
    recs += [RequestRecord(f"e{i}", error="http_500: x", sent_at=0.0) for i in range(errors)]
    return recs


def _stopped(
    ok: int, refused: int, truncated: int, errors: int, *, sent: int, planned: int, late: int
) -> LevelMetrics:
    """A level stopped on p99 TTFT after ``sent`` of ``planned`` requests, ``late`` of them
    still unfinished past the SLO."""
    s = summarize(_records(ok, refused, truncated, errors), 2.0)
    s, stop = stopped_summary(
        s,
        reason="p99_ttft",
        at_request=sent,
        planned=planned,
        replay_s=2.0,
        ttft_known_s=[1.0] * ok + [4.0] * late,
        saved_s_at_least=1.0,
    )
    return LevelMetrics.from_summary(s, stop)


def _level(m: LevelMetrics, slo: Slo, scale: float = 2.0) -> LevelRecord:
    return level_record(0, LevelOutcome(scale, 8.0, m), score_level(m, slo, scale))


@st.composite
def _stops(draw: Any) -> tuple[int, int, int, int, int, int, int, float]:
    planned = draw(st.integers(1, 600))
    sent = draw(st.integers(1, planned))
    refused = draw(st.integers(0, sent))
    errors = draw(st.integers(0, sent - refused))
    late = draw(st.integers(0, sent - refused - errors))
    ok = sent - refused - errors - late
    truncated = draw(st.integers(0, ok))
    limit = draw(st.sampled_from([0.0, 0.005, 0.01, 0.05]) | st.floats(0.0, 0.5))
    return planned, sent, refused, errors, late, ok, truncated, limit


@given(_stops())
@settings(max_examples=300, deadline=None)
def test_a_stopped_level_reports_a_rate_violation_only_when_the_requests_sent_make_it_certain(
    stop: tuple[int, int, int, int, int, int, int, float],
) -> None:
    planned, sent, refused, errors, late, ok, truncated, limit = stop
    slo = Slo(p99_ttft_ms=SLO_MS, max_error_rate=limit, max_overlength_rate=limit)
    m = _stopped(ok, refused, truncated, errors, sent=sent, planned=planned, late=late)
    assume(m.p99_ttft_ms is not None and m.p99_ttft_ms > SLO_MS)  # what makes the rule stop
    ls = score_level(m, slo, 2.0)
    names = {v.name for v in ls.broken}
    shown = record_stopped(_level(m, slo))
    assert shown is not None
    for name, count in (("overlength_rate", refused + truncated), ("error_rate", errors)):
        # the whole level's rate, whatever its unsent requests do, lies in [lowest, highest]
        lowest = overlength_rate(count, 0, planned)
        highest = overlength_rate(count + planned - sent, 0, planned)
        certain = lowest > limit
        assert (name in names) is certain
        if certain:  # reported: every way the level could have ended breaks the limit
            v = next(v for v in ls.broken if v.name == name)
            assert v.bound and v.value == lowest and v.text.split(" ")[1] == "≥"
            assert shown.values[name] == lowest and name in shown.bounds
        else:  # not reported: the level could have ended within the limit
            assert lowest <= limit
            assert shown.values[name] is None and shown.text(name, ".1%") == "not measured"
        assert lowest <= highest
    # the stop's own reason is always reported, as a lower bound over the requests sent
    assert "p99_ttft" in names and not ls.feasible
    # what the sampler sees is the figures' margins, as before: the search is unchanged
    assert ls.violations["overlength_rate"] == m.overlength_rate - limit
    if m.completed == 0:  # figures over no finished request are never 0
        assert shown.values["output_throughput"] is None
        assert shown.values["p99_tpot_ms"] is None
        assert "0 tok/s" not in progress_figures(m) and "TPOT not" in progress_figures(m)


def test_refused_requests_finishing_first_do_not_read_as_an_over_length_violation() -> None:
    # the quickstart's case: 4 refusals among 8 finished of 251 sent, 400 planned, limit 1 %
    slo = Slo(p99_ttft_ms=SLO_MS, max_overlength_rate=0.01)
    m = _stopped(4, 4, 0, 0, sent=251, planned=400, late=20)
    assert m.overlength_rate == 0.5  # over the finished requests: no figure of the level
    ls = score_level(m, slo, 2.0)
    assert [v.text for v in ls.broken] == ["p99 TTFT ≥ 4,000 ms > 3,000 ms"]
    assert ls.violations["overlength_rate"] > 0  # the margins are untouched
    # 5 refusals of 400 planned already break 1 % whatever comes next
    five = score_level(_stopped(4, 5, 0, 0, sent=251, planned=400, late=20), slo, 2.0)
    assert [v.text for v in five.broken][1] == "over-length ≥ 1.2 % > 1 %"
    assert certain_rate(4, 400, 0.01) is None and certain_rate(5, 400, 0.01) == 5 / 400


def test_a_bound_percentile_is_never_read_against_one_over_other_requests() -> None:
    # 200 finished at 1 s, 10 unfinished aged 4 s at the stop: the p99 over every request
    # sent is above the p99.9 of the finished ones alone unless both are restated
    m = _stopped(200, 0, 0, 0, sent=210, planned=400, late=10)
    s = m.summary
    assert m.stop is not None and m.stop.bound == "ttft"
    assert s["p99_ttft_ms"] > SLO_MS and s["p99.9_ttft_ms"] >= s["p99_ttft_ms"]
    assert s["p50_ttft_ms"] <= s["p90_ttft_ms"] <= s["p99_ttft_ms"] <= s["p99.9_ttft_ms"]
    # over the same values, the aged ones included and the 190 not yet sent at 0: a lower
    # bound of the mean the whole level would print
    assert s["mean_ttft_ms"] == pytest.approx((200 * 1000.0 + 10 * 4000.0) / 400)
    assert "4,000" in progress_figures(m) and "≥ " in progress_figures(m)


def test_a_level_that_sent_every_request_is_not_stopped_early() -> None:
    every = StopInfo("p99_tpot", 300, 300)
    assert not every.early
    assert every.text == "stopped on p99 TPOT once all 300 requests were sent"
    old = {"reason": "p99_ttft", "at_request": 37, "planned_requests": 300}  # before "bound"
    some = StopInfo.of({"early_stop": old})
    assert some is not None and some.early and some.bound == "ttft"
    assert some.text == "stopped early on p99 TTFT at request 37 of 300"
    assert StopInfo.of({"completed": 3}) is None and StopInfo.of(None) is None


def _study_with_stopped_trial() -> tuple[StudyRecord, list[TrialRecord]]:
    slo = Slo(p99_ttft_ms=SLO_MS, p99_tpot_ms=45.0, max_overlength_rate=0.01)
    # nothing finished by the stop: a bound on p99 TTFT and nothing else
    low = _level(_stopped(0, 2, 0, 0, sent=37, planned=300, late=30), slo, 0.25)
    high = _level(_stopped(50, 0, 0, 0, sent=300, planned=300, late=5), slo, 0.5)
    t = TrialRecord(
        study_name="s",
        optuna_trial_number=3,
        stage="joint",
        state="COMPLETE",
        params={},
        engine_args={"max_model_len": 4096, "max_num_seqs": 8},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
        objective=0.0,
        feasible=False,
        levels=[low, high],
    )
    study = StudyRecord("s", "name: s\n", {}, "slo-capacity", "sim-virtual", "s")
    return study, [t]


def test_show_marks_a_stopped_level_and_never_prints_0_for_what_it_did_not_measure() -> None:
    _, trials = _study_with_stopped_trial()
    row = show_rows(trials)[0]
    assert row["stopped"]["text"] == "stopped early on p99 TTFT at request 37 of 300"
    assert row["p99_ttft_ms"] == 4000.0 and "p99_ttft_ms" in row["stopped"]["bounds"]
    assert row["p99_tpot_ms"] is None and "p99_tpot_ms" in row["stopped"]["not_measured"]
    assert row["violations"] == ["p99 TTFT ≥ 4,000 ms > 3,000 ms"]  # no over-length, 2 of 300
    for wide in (False, True):
        table, _, width = show_table("s", [row], 200, wide=wide)
        out = io.StringIO()
        Console(file=out, width=width).print(table)
        text = out.getvalue()
        assert "≥4,000" in text and "stopped early on p99 TTFT at request 37 of 300" in text
        # TTFT a bound, TPOT not measured (never 0; the trial's own tok/s is its objective)
        assert re.search(r"≥4,000\s+-\s", text)
    why = why_infeasible(trials[0])
    assert why is not None and why.endswith("(stopped early on p99 TTFT at request 37 of 300)")


def test_exports_and_report_mark_stopped_levels_and_leave_unmeasured_figures_empty() -> None:
    study, trials = _study_with_stopped_trial()
    body = json.loads(export_json(study, trials))
    low, high = body["trials"][0]["levels"]
    assert low["stopped"] == {"reason": "p99_ttft", "at_request": 37, "planned_requests": 300}
    for key in ("output_throughput", "p99_tpot_ms", "p99_itl_ms", "overlength_rate"):
        assert low[key] is None  # over no finished request, or not certain: not 0
    assert low["violations"][0]["bound"] is True and low["p99_ttft_ms"] == 4000.0
    assert high["stopped"]["at_request"] == high["stopped"]["planned_requests"]  # not early
    assert high["output_throughput"] > 0
    full = json.loads(export_json(study, trials, full=True))
    assert full["trials"][0]["levels"][0]["stopped"]["reason"] == "p99_ttft"
    (row,) = csv.DictReader(io.StringIO(export_csv(trials)))
    assert row["stopped"] == "stopped early on p99 TTFT at request 37 of 300"
    assert row["p99_tpot_ms"] == "" and row["p99_ttft_ms"] == "4000.0"
    note = trial_note(trials[0], "slo-capacity")
    assert "stopped early on p99 TTFT at request 37 of 300" in note
    assert "stopped on p99 TTFT once all 300 requests were sent" in note
    # an infeasible trial's margins: the note says what a broken SLO's margin reads
    names = ["p99_ttft", "p99_tpot", "error_rate", "overlength_rate"]
    t = dataclasses.replace(trials[0], constraints=[264 / 300, 0.0, 0.0, -0.01])
    assert "`p99_ttft` +0.880" in trial_note(t, "slo-capacity", names)
    assert "share of its level still to be sent" in trial_note(t, "slo-capacity", names)
    ok = dataclasses.replace(t, feasible=True, constraints=[-0.2, -0.1, 0.0, -0.01])
    assert "share of its level" not in trial_note(ok, "slo-capacity", names)
    assert figure_cell(trials[0].levels[0], "output_throughput") == "-"
    assert figure_cell(trials[0].levels[0], "p99_ttft_ms") == "≥ 4,000.0"
