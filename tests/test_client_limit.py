"""A level the client could not drive (docs/loadgen.md#5-client-limited-levels): the check's
bounds on send lag and read gaps, the mark a level carries and stores, scoring that rests no
verdict on it, measure() re-running it once and stopping with one line when the re-run is
client-limited too, a real run whose event loop is blocked, and `autotune bench`'s warning."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from support.runners import ScriptedRunner, feasible_up_to
from support.studies import config
from test_bench_cli import run_main, sim_url  # noqa: F401  (sim_url is a fixture)
from test_bench_sim import sim_server

from autotune.cli import bench as cli_bench
from autotune.errors import ClientLimitError
from autotune.loadgen.bench import run_bench
from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.client_limit import (
    LOOP_LAG_FLOOR_MS,
    LOOP_LAG_KEY,
    READ_GAP_FLOOR_MS,
    SEND_LAG_FLOOR_MS,
    ClientLimit,
    check,
    send_lag_bound_ms,
)
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.runner import run_load
from autotune.store import RepeatRecord
from autotune.tuning.measure.level_plan import LevelPlan, measure
from autotune.tuning.measure.outcome import LevelOutcome, level_record
from autotune.tuning.measure.scoring import Slo, score_level, score_trial
from autotune.tuning.measure.validate import measure_run
from autotune.workload.build import build_workload
from autotune.workload.core import WorkloadRequest

SLO = Slo(p99_ttft_ms=3000.0, p99_tpot_ms=45.0)


def summary(loop: str | None = "open", **over: Any) -> dict[str, Any]:
    """A client's summary with healthy figures, ``over`` replacing some."""
    s: dict[str, Any] = {
        "completed": 100,
        "failed": 0,
        "p99_ttft_ms": 500.0,
        "p99_tpot_ms": 20.0,
        "p99_schedule_lag_ms": 5.0,
        "mean_arrival_gap_ms": 6.25,  # 160 req/s
        "median_itl_ms": 12.0,
        "itl_gaps": 3100,
        "time_scale": 1.0,
        "output_throughput": 100.0,
        "request_throughput": 4.0,
    }
    if loop is not None:
        s["client_loop"] = loop
    return s | over


# -- the check ------------------------------------------------------------------------------
def test_send_lag_past_its_bound_marks_an_open_loop_level() -> None:
    assert check(summary()) is None
    cl = check(summary(p99_schedule_lag_ms=450.0))
    assert cl == ClientLimit("send_lag", 450.0, SEND_LAG_FLOOR_MS)
    assert cl.text == "client-limited: p99 send lag 450 ms > 50 ms"
    assert check(summary(p99_schedule_lag_ms=SEND_LAG_FLOOR_MS)) is None  # the bound holds


def test_the_lag_bound_is_two_arrival_gaps_above_its_floor_and_wall_time_when_scaled() -> None:
    # 2 req/s: a mean gap of 500 ms, so up to 1 s of lag bunches at most two requests
    assert send_lag_bound_ms(500.0) == 1000.0
    assert check(summary(mean_arrival_gap_ms=500.0, p99_schedule_lag_ms=900.0)) is None
    assert check(summary(mean_arrival_gap_ms=500.0, p99_schedule_lag_ms=1100.0)) is not None
    assert send_lag_bound_ms(None) == SEND_LAG_FLOOR_MS  # one request: no gap
    # a server 10x faster than wall time: the floor is 50 wall ms = 500 engine ms
    assert send_lag_bound_ms(6.25, 10.0) == 500.0
    assert check(summary(time_scale=10.0, p99_schedule_lag_ms=450.0)) is None


def test_waiting_for_a_slot_is_not_client_lag() -> None:
    for loop in ("closed", "open-capped", "burst"):
        assert check(summary(loop, p99_schedule_lag_ms=5000.0)) is None


def test_chunks_read_in_bursts_mark_any_client_level() -> None:
    for loop in ("open", "open-capped", "burst", "closed"):
        cl = check(summary(loop, median_itl_ms=0.0))
        assert cl == ClientLimit("read_gap", 0.0, READ_GAP_FLOOR_MS)
    assert "read in bursts" in ClientLimit("read_gap", 0.0, 0.1).text
    # one-token requests have no gaps: nothing to read
    assert check(summary(median_itl_ms=0.0, itl_gaps=0)) is None
    # a simulated server 10x faster than wall time writes its due steps together: its
    # bursts are its own, not the client's (docs/loadgen.md#5-client-limited-levels)
    assert check(summary(median_itl_ms=0.0, time_scale=10.0)) is None


def test_bursts_are_the_clients_only_when_its_own_loop_ran_late() -> None:
    """A client whose timers kept time read each chunk as it came: bursts it saw were
    written together by the server (as a CPU host's API server does when it shares the
    cores), which every client sees, so they are a measurement, not a client limit."""
    punctual = summary(median_itl_ms=0.0, **{LOOP_LAG_KEY: 0.4})
    assert check(punctual) is None
    late = summary(median_itl_ms=0.0, **{LOOP_LAG_KEY: LOOP_LAG_FLOOR_MS})
    assert check(late) == ClientLimit("read_gap", 0.0, READ_GAP_FLOOR_MS)
    # the send lag needs no such evidence: a late send is late whatever the loop says
    assert check(summary(p99_schedule_lag_ms=450.0, **{LOOP_LAG_KEY: 0.4})) is not None


def test_no_client_is_never_client_limited() -> None:
    # the in-process simulator's summary has no client_loop
    assert check(summary(None, p99_schedule_lag_ms=9000.0, median_itl_ms=0.0)) is None


def test_summarize_writes_the_figures_only_for_a_client() -> None:
    recs = [
        RequestRecord(
            f"r{i}",
            success=True,
            output_tokens=3,
            scheduled_at=0.1 * i,
            sent_at=0.1 * i + 0.002,
            first_token_at=0.1 * i + 0.05,
            finished_at=0.1 * i + 0.07,
            itl=[0.01, 0.01],
            ttft=0.048,
            e2el=0.068,
        )
        for i in range(11)
    ]
    s = summarize(recs, 1.1, client_loop="open")
    assert s["client_loop"] == "open" and s["itl_gaps"] == 22
    assert s["mean_arrival_gap_ms"] == pytest.approx(100.0)
    assert "client_loop" not in summarize(recs, 1.1)


# -- the mark: metrics, stored level, scoring -----------------------------------------------
def test_the_level_carries_stores_and_reads_back_its_mark() -> None:
    m = LevelMetrics.from_summary(summary(p99_schedule_lag_ms=450.0))
    assert m.client_limit == ClientLimit("send_lag", 450.0, 50.0)
    assert m.with_preemptions(0).client_limit == m.client_limit
    assert LevelMetrics.from_summary(summary()).client_limit is None
    ls = score_level(m, SLO, 2.0)
    rec = level_record(0, LevelOutcome(2.0, 320.0, m), ls)
    assert ClientLimit.of(rec.metrics) == m.client_limit
    assert rec.feasible is False
    assert rec.violations[0]["text"] == "client-limited: p99 send lag 450 ms > 50 ms"
    clean = LevelMetrics.from_summary(summary())
    assert ClientLimit.of(level_record(0, LevelOutcome(2.0, 320.0, clean), ls).metrics) is None


def test_no_verdict_rests_on_a_client_limited_level() -> None:
    good = LevelMetrics.from_summary(summary())
    lagged = LevelMetrics.from_summary(summary(p99_schedule_lag_ms=450.0))
    ls_lag = score_level(lagged, SLO, 2.0)
    # its SLO figures held, yet it is not feasible, and nothing reads it as a verdict
    assert ls_lag.violations["p99_ttft"] < 0 and not ls_lag.feasible
    assert ls_lag.texts == ["client-limited: p99 send lag 450 ms > 50 ms"]
    alone = score_trial([ls_lag])
    assert not alone.feasible and alone.capacity_scale is None and alone.levels == (ls_lag,)
    ok = score_level(good, SLO, 1.0)
    # a broken level is the closest one, not the client-limited one whose margins look better
    broken = score_level(dataclasses.replace(good, p99_ttft_ms=9000.0), SLO, 1.5)
    ts = score_trial([broken, ls_lag])
    assert ts.constraints == broken.violations
    assert score_trial([ls_lag, ok]).capacity_scale == 1.0


# -- measure(): the re-run, and the line when the host cannot drive the load ----------------
def lagging_at(lag_ms: list[float]) -> Any:
    """Levels that hold the SLOs up to 2x, the first len(lag_ms) of them sent with that p99
    send lag (a client-limited level when above 50 ms)."""
    base = feasible_up_to(2.0)
    calls = [0]

    def level(scale: float) -> LevelMetrics:
        i = calls[0]
        calls[0] += 1
        lag = lag_ms[i] if i < len(lag_ms) else 1.0
        m = base(scale)
        return dataclasses.replace(m, client_limit=check(summary(p99_schedule_lag_ms=lag)))

    return level


def run_measure(mode: str, lags: list[float]) -> tuple[Any, ScriptedRunner]:
    cfg, _ = config(mode=mode)
    runner = ScriptedRunner(levels=lagging_at(lags))
    wl = build_workload(cfg.workload, vocab_size=32_000)
    return asyncio.run(measure(runner, wl, LevelPlan.of(cfg))), runner


def test_a_client_limited_level_is_run_again_and_the_rerun_counts() -> None:
    measured, runner = run_measure("fixed-rate", [450.0])
    assert [c for c in runner.calls if c[0] == "level"] == [("level", 1.0)] * 2
    first, second = measured.levels
    assert first.score.client_limit is not None and not first.score.feasible
    assert second.score.client_limit is None and second.score.feasible
    assert score_trial(measured.scores).feasible


def test_a_fixed_rate_validation_run_takes_the_rerun_and_counts_both_levels() -> None:
    """A one-level validation run whose level was re-run has two levels: the re-run's
    figures are the run's (a validation run in CI crashed on the second level)."""
    cfg, _ = config(mode="fixed-rate")
    runner = ScriptedRunner(levels=lagging_at([450.0]))
    wl = build_workload(cfg.workload, vocab_size=32_000)
    run = RepeatRecord("t", 0, 0, 0, "candidate", {"max_num_seqs": 8}, "seed 1", 1, 1)
    out = asyncio.run(measure_run(cfg, runner, wl, run, "validate-0-0000"))
    assert out.levels == 2 and out.slo_held is True and out.capacity_scale == 1.0


def test_the_capacity_search_sees_only_the_rerun() -> None:
    clean, _ = run_measure("slo-capacity", [])
    measured, runner = run_measure("slo-capacity", [450.0])
    scales = [s for kind, s in runner.calls if kind == "level"]
    assert scales[0] == scales[1]  # the same load, once more
    # the search ends where it ends without the lag, one level later
    assert [lv.score.scale for lv in measured.levels][1:] == [lv.score.scale for lv in clean.levels]
    assert measured.capacity == clean.capacity
    assert measured.levels[0].score.client_limit is not None


def test_client_limited_twice_stops_the_run_with_one_line() -> None:
    stored: list[Any] = []
    cfg, _ = config(mode="slo-capacity")
    runner = ScriptedRunner(levels=lagging_at([450.0, 620.0]))
    wl = build_workload(cfg.workload, vocab_size=32_000)
    plan = LevelPlan.of(cfg)
    with pytest.raises(ClientLimitError) as info:
        asyncio.run(measure(runner, wl, plan, on_level=stored.append))
    line = str(info.value)
    rate = 4.0 * stored[0].outcome.scale
    assert line == (
        f"this host cannot drive {rate:,.4g} req/s against the server: p99 send lag 620 ms "
        "> 50 ms, twice; lower strategy.capacity_high or run the load generator on a bigger host"
    )
    assert "\n" not in line and info.value.exit_code == 1
    # both levels were handed on (stored, marked) before the run stopped
    assert [lv.score.client_limit is not None for lv in stored] == [True, True]


# -- real runs: a blocked event loop lags the sends -----------------------------------------
def stalled_run(n: int, every_s: float, stall_s: float) -> Any:
    """``n`` requests 20 ms apart against a simulated server in real time, the client's loop
    stalled for ``stall_s`` at every progress snapshot (one every ``every_s``)."""

    async def go() -> Any:
        srv = sim_server(io.StringIO(), 1.0)
        async with TestServer(srv.app()) as ts:
            specs = [
                WorkloadRequest(
                    64, 4, prompt_token_ids=(11,) * 64, arrival=0.02 * i, request_id=f"r{i}"
                )
                for i in range(n)
            ]
            return await run_load(
                str(ts.make_url("")),
                specs,
                LoadOptions(model="meta-llama/Llama-3.1-8B-Instruct", progress_interval=every_s),
                progress=lambda _p: time.sleep(stall_s),
            )

    return asyncio.run(go())


def test_a_client_whose_loop_blocks_is_flagged() -> None:
    # every progress snapshot stalls the loop for 150 ms: sends due then go late
    res = stalled_run(60, 0.3, 0.15)
    assert res.summary["completed"] == 60
    cl = LevelMetrics.from_summary(res.summary).client_limit
    assert cl is not None and cl.bound == "send_lag" and cl.value_ms > 100.0
    assert res.summary["p99_schedule_lag_ms"] == cl.value_ms


def test_a_real_run_reports_its_loop_lag_and_a_blocked_loop_shows_in_it() -> None:
    free, stalled = stalled_run(40, 0.1, 0.0), stalled_run(40, 0.1, 0.05)
    assert free.summary[LOOP_LAG_KEY] is not None and stalled.summary[LOOP_LAG_KEY] is not None
    # a 50-ms stall every 100 ms: a third or more of the 10-ms wake-ups run late by tens of ms
    assert stalled.summary[LOOP_LAG_KEY] >= 20.0 > free.summary[LOOP_LAG_KEY]


def test_bench_prints_the_warning(
    sim_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = run_bench

    async def blocking(*a: Any, **kw: Any) -> Any:
        kw["progress"] = lambda _p: time.sleep(0.2)  # the host's client stalls
        return await real(*a, **kw)

    monkeypatch.setattr(cli_bench, "run_bench", blocking)
    args = ["bench", "--base-url", sim_url, "--num-prompts", "40", "--random-input-len", "64"]
    args += ["--random-output-len", "4", "--request-rate", "20"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    warning = [ln for ln in out.splitlines() if ln.startswith("warning: client-limited: ")]
    assert len(warning) == 1, out
    assert "p99 send lag" in warning[0] and "this host could not drive the load" in warning[0]


def test_bench_warns_exactly_when_its_saved_result_is_marked(
    sim_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # all at once within 2 slots: the lag is never the client's, so only bursts of chunks
    # can mark it (a starved host can produce them: then the warning and the mark go together)
    path = tmp_path / "r.json"
    args = ["bench", "--base-url", sim_url, "--num-prompts", "8", "--random-input-len", "64"]
    args += ["--random-output-len", "4", "--max-concurrency", "2", "--save-result", str(path)]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    saved = json.loads(path.read_text())
    mark = ClientLimit.of(saved)
    assert saved["client_loop"] == "open-capped" and saved["p99_schedule_lag_ms"] >= 0
    assert mark == check(saved)
    assert ("warning: client-limited" in out) == (mark is not None)
    assert mark is None or mark.bound == "read_gap"
