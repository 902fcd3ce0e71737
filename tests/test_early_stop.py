"""Early stop inside a level (docs/tuning.md#10-early-stop-inside-a-level): the p99 bound
with numpy, the rule, verdicts that never change (recorded timelines and the simulator), the
simulator's stop hook, the HTTP load generator's stop, and the config switch."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fake_server import Fake, Spec
from support.studies import config

from autotune.loadgen import LoadOptions, run_load
from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stop_rule import StopRule, Tally, needed, stopped_summary
from autotune.loadgen.stopped import StopInfo
from autotune.loadgen.verdict_point import VerdictAt
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import SimWatch, records_from_sim, sim_engine_args, sim_requests
from autotune.sim.engine import Engine
from autotune.sim.virtual_loop import simulate
from autotune.tuning.measure.early_stop import rule_of
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.level_plan import LevelPlan
from autotune.tuning.measure.outcome import level_record, replay_seconds
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.scoring import Slo, score_level, score_trial
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.workload.build import build_workload, scale_rate

MODEL, HW = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_hardware("A100-80GB")
SLO = Slo(p99_ttft_ms=3000.0, p99_tpot_ms=45.0)
RULE = StopRule(3000.0, 45.0, 0.0, 0.01)
ARGS = {
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
}
ARGS_ENGINE = sim_engine_args(ARGS, {})


# -- the bound, with numpy ------------------------------------------------------------------
def test_bound_is_the_least_count_that_forces_the_p99_above_the_limit() -> None:
    """The worst case for k values above S: the others at 0, those k just above S. k =
    needed(n) is enough for every n, and k - 1 is not."""
    s = 45.0
    above = np.nextafter(s, np.inf)
    for n in range(1, 2501):
        k = needed(n)
        assert k == math.ceil(0.01 * (n - 1) - 1e-12) + 1
        x = np.zeros(n)
        x[:k] = above
        assert np.percentile(x, 99) > s, n
        x[k - 1] = 0.0
        assert k == 1 or np.percentile(x, 99) <= s, n


@given(
    n_max=st.integers(1, 1500),
    data=st.data(),
)
@settings(max_examples=80, deadline=None)
def test_k_of_n_max_above_the_slo_put_the_final_p99_above_it(n_max: int, data: Any) -> None:
    """Once k >= needed(n_max) successes exceed, the p99 over the final successes (at most
    n_max of them, the k included) exceeds the SLO whatever the other values are."""
    slo = data.draw(st.floats(1.0, 5000.0))
    k = needed(n_max)
    n = data.draw(st.integers(min(k, n_max), n_max))  # later failures only shrink the set
    over = data.draw(
        st.lists(st.floats(slo, 1e6, exclude_min=True), min_size=min(k, n), max_size=min(k, n))
    )
    rest = data.draw(st.lists(st.floats(0.0, 1e6), min_size=n - len(over), max_size=n - len(over)))
    x = np.asarray(over + rest)
    np.random.default_rng(n).shuffle(x)
    assert np.percentile(x, 99) > slo


def test_rule_counts_errors_latencies_and_in_flight_requests_that_may_fail() -> None:
    assert RULE.verdict(Tally(400)) is None
    assert RULE.verdict(Tally(400, failed=1, errors=1)) == "error_rate"  # limit 0
    assert StopRule(max_error_rate=0.01).verdict(Tally(400, failed=4, errors=4)) is None
    assert StopRule(max_error_rate=0.01).verdict(Tally(400, failed=5, errors=5)) == "error_rate"
    assert needed(400) == 5
    assert RULE.verdict(Tally(400, ttft_over=4)) is None
    assert RULE.verdict(Tally(400, ttft_over=5)) == "p99_ttft"
    assert RULE.verdict(Tally(400, tpot_over=5)) == "p99_tpot"
    # over-length rejections leave fewer successes: 100 planned minus 1 failed -> needs 2
    assert RULE.verdict(Tally(101, failed=1, over_length=1, tpot_over=2)) == "p99_tpot"
    # 5 over the TTFT SLO, 3 of them in flight: with no error allowed and 4 over-length
    # failures allowed (1 %), they count only beyond what may still fail
    assert RULE.verdict(Tally(400, ttft_over=5, ttft_pending=3)) is None
    assert RULE.verdict(Tally(400, ttft_over=10, ttft_pending=3)) == "p99_ttft"


# -- verdicts never change: recorded request timelines -------------------------------------
@dataclass(frozen=True)
class Timed:
    arrival: float
    ttft: float
    tpot: float
    n: int
    fails: bool  # an over-length 400 at arrival

    @property
    def finish(self) -> float:
        return self.arrival + self.ttft + (self.n - 1) * self.tpot

    def record(self, i: int) -> RequestRecord:
        if self.fails:
            return RequestRecord(
                f"r{i}", error="over_length: x", over_length=True, finished_at=self.arrival
            )
        first = self.arrival + self.ttft
        return RequestRecord(
            f"r{i}",
            success=True,
            output_tokens=self.n,
            scheduled_at=self.arrival,
            sent_at=self.arrival,
            first_token_at=first,
            last_token_at=self.finish,
            finished_at=self.finish,
            ttft=first - self.arrival,
            e2el=self.finish - self.arrival,
        )


def _summary(
    reqs: list[Timed], now: float, rule: StopRule | None
) -> tuple[dict[str, Any], StopInfo | None]:
    """What a replay knows at ``now``, and the stop when ``rule`` stops it there."""
    t = Tally(len(reqs))
    for q in reqs if rule is not None else ():
        if q.arrival > now:
            continue
        if q.fails:
            t.failed, t.over_length = t.failed + 1, t.over_length + 1
        elif q.finish <= now:
            rec = q.record(0)
            t.ttft_over += rec.ttft is not None and rule.exceeds_ttft(rec.ttft)
            t.tpot_over += rec.output_tokens > 1 and rule.exceeds_tpot(rec.tpot)
        elif q.arrival + q.ttft <= now:
            t.ttft_over += rule.exceeds_ttft((q.arrival + q.ttft) - q.arrival)
            t.tpot_over += q.n > 1 and rule.exceeds_tpot(_tpot_bound(q, now))
        else:
            t.ttft_over += rule.exceeds_ttft(now - q.arrival)
    reason = rule.verdict(t) if rule is not None else None
    done = [
        q.record(i) for i, q in enumerate(reqs) if q.arrival <= now and (q.fails or q.finish <= now)
    ]
    s = summarize(done, max(now, 1e-9))
    if reason is None:
        return s, None
    known = [
        (q.arrival + q.ttft if q.arrival + q.ttft <= now else now) - q.arrival
        for q in reqs
        if q.arrival <= now and not q.fails
    ]
    tpots = [r.tpot for r in done if r.success and r.output_tokens > 1]
    tpots += [
        _tpot_bound(q, now)
        for q in reqs
        if not q.fails and q.n > 1 and q.arrival + q.ttft <= now < q.finish
    ]
    return stopped_summary(
        s,
        reason=reason,
        at_request=0,
        planned=len(reqs),
        replay_s=now,
        ttft_known_s=known,
        saved_s_at_least=0.0,
        tpot_known_s=tpots,
    )


def _tpot_bound(q: Timed, now: float) -> float:
    """The simulator's bound for a request decoding at ``now``: its output length is known."""
    first = q.arrival + q.ttft
    return ((now - q.arrival) - (first - q.arrival)) / (q.n - 1)


@given(
    reqs=st.lists(
        st.builds(
            Timed,
            arrival=st.floats(0.0, 60.0),
            ttft=st.sampled_from([0.5, 2.999, 3.0, 3.001, 9.0]) | st.floats(0.01, 20.0),
            tpot=st.sampled_from([0.02, 0.045, 0.0451, 0.1]) | st.floats(0.001, 0.2),
            n=st.integers(1, 300),
            fails=st.integers(0, 30).map(lambda i: i == 0),
        ),
        min_size=1,
        max_size=150,
    )
)
@settings(max_examples=80, deadline=None)
def test_stopped_and_full_replays_of_a_timeline_reach_the_same_verdict(reqs: list[Timed]) -> None:
    """Checked at every event of a recorded timeline (arrivals, first tokens, finishes):
    where the rule stops, the stopped level's score is the full level's verdict."""
    full, _ = _summary(reqs, math.inf, None)
    verdict = score_level(LevelMetrics.from_summary(full), SLO).feasible
    events = sorted({q.arrival for q in reqs} | {q.arrival + q.ttft for q in reqs})
    events += sorted(q.finish for q in reqs)
    for now in sorted(events):
        s, stop = _summary(reqs, now, RULE)
        if stop is not None:
            assert not verdict, stop
            assert not score_level(LevelMetrics.from_summary(s, stop), SLO).feasible
            break


def test_a_timeline_stops_once_enough_requests_age_past_the_slo() -> None:
    reqs = [Timed(0.1 * i, 9.0, 0.02, 10, False) for i in range(50)]  # every TTFT 9 s
    s, stop = _summary(reqs, 3.15, RULE)  # needed(50) = 2: ages 3.15 and 3.05 s
    assert stop is not None and stop.reason == "p99_ttft" and s["completed"] == 0
    assert "early_stop" not in s  # the summary holds only bench keys
    assert _summary(reqs, 3.05, RULE)[1] is None  # one request older than 3 s only
    assert s["p99_ttft_ms"] > 3000.0


# -- the simulator ------------------------------------------------------------------------
def _level(
    rule: StopRule | None,
    scale: float,
    wl: Any,
    args: dict[str, int] = ARGS,
    observe: StopRule | None = None,
) -> Any:
    r = VirtualRunner(MODEL, HW, model_name="m", static_args={}, seed=3, jitter_cv=0.015)
    r.early_stop, r.observe = rule, observe

    async def go() -> Any:
        await r.start(args, "t")
        return await r.run_level(wl, scale)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def workload() -> Any:
    cfg, _ = config()
    return build_workload(cfg.workload, vocab_size=MODEL.vocab_size)


@given(
    scale=st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]),
    mns=st.sampled_from([16, 64, 256]),
    mnbt=st.sampled_from([512, 2048, 8192]),
    ttft=st.sampled_from([300.0, 3000.0]),
    tpot=st.sampled_from([25.0, 45.0, None]),
)
@settings(max_examples=12, deadline=None)
def test_simulated_levels_reach_the_full_replays_verdict(
    workload: Any, scale: float, mns: int, mnbt: int, ttft: float, tpot: float | None
) -> None:
    slo, rule = Slo(ttft, tpot), StopRule(ttft, tpot)
    args = {**ARGS, "max_num_seqs": mns, "max_num_batched_tokens": mnbt}
    full, cut = _level(None, scale, workload, args), _level(rule, scale, workload, args)
    feasible = score_level(full.metrics, slo, scale).feasible
    assert score_level(cut.metrics, slo, scale).feasible == feasible
    stop = cut.stop
    assert stop is None or not feasible  # a feasible level is never stopped
    if stop is not None:
        assert stop.reason in ("p99_ttft", "p99_tpot")
        assert cut.replay_s < full.replay_s
        assert stop.replay_s == cut.replay_s
        # each figure restated as a bound is one: never above what the full level printed
        # (the settle rule and Optuna's constraints read its distance from the SLO)
        name = stop.reason.removeprefix("p99_")
        for key, v in cut.metrics.summary.items():
            if key.endswith(f"_{name}_ms") and not key.startswith("std"):
                assert v <= full.metrics.summary[key] * (1 + 1e-9), key
    else:
        assert cut.metrics == full.metrics


@given(
    scale=st.sampled_from([1.0, 2.0, 3.0, 4.0, 8.0]),
    mns=st.sampled_from([16, 64, 256]),
    mnbt=st.sampled_from([512, 8192]),
    ttft=st.sampled_from([300.0, 3000.0]),
    tpot=st.sampled_from([25.0, 45.0, None]),
)
@settings(max_examples=10, deadline=None)
def test_a_level_replayed_to_its_end_tells_the_sampler_what_a_stopped_one_does(
    workload: Any, scale: float, mns: int, mnbt: int, ttft: float, tpot: float | None
) -> None:
    """The observing watch notes the stop the rule would have made, at the same request, and
    the sampler margins of both levels are equal where positive: what Optuna's constrained
    samplers rank infeasible trials by (docs/tuning.md#10-early-stop-inside-a-level, "What
    the sampler sees")."""
    slo, rule = Slo(ttft, tpot), StopRule(ttft, tpot)
    args = {**ARGS, "max_num_seqs": mns, "max_num_batched_tokens": mnbt}
    full = _level(None, scale, workload, args, observe=rule)
    cut = _level(rule, scale, workload, args)
    assert full.stop is None and full.metrics.observed == cut.metrics.verdict
    a, b = score_level(full.metrics, slo, scale), score_level(cut.metrics, slo, scale)
    assert a.feasible == b.feasible and (a.verdict is None) == a.feasible
    pos = [{k: v for k, v in x.sampler_margins.items() if v > 0} for x in (a, b)]
    assert pos[0] == pos[1]
    assert bool(pos[0]) != a.feasible
    # the point is stored with the level and read back
    stored = level_record(0, full, a).metrics
    assert VerdictAt.of(stored) == full.metrics.observed
    # without the observing rule nothing is noted, and the figures' margins are the sampler's
    plain = score_level(_level(None, scale, workload, args).metrics, slo, scale)
    assert plain.verdict is None and plain.sampler_margins == plain.violations


def test_the_sampler_ranks_infeasible_trials_by_how_late_their_verdict_came() -> None:
    """Two infeasible trials whose stopped levels both read just past the SLO: the one whose
    verdict came later (closer to holding) is told the smaller violation, and its other
    margins are at most 0; a level with no known point keeps its figures' margins."""

    def stopped(at: int, p99: float) -> LevelMetrics:
        return LevelMetrics(
            completed=at,
            failed=0,
            p99_ttft_ms=1000.0,
            p99_tpot_ms=p99,
            stop=StopInfo("p99_tpot", at, 400, "tpot"),
            summary={"error_rate": 0.0},
        )

    early = score_trial([score_level(stopped(20, 45.2), SLO, 0.25)])
    late = score_trial([score_level(stopped(380, 45.4), SLO, 0.25)])
    assert early.constraints["p99_tpot"] == pytest.approx(381 / 400)
    assert late.constraints["p99_tpot"] == pytest.approx(21 / 400)
    assert late.constraints["p99_tpot"] < early.constraints["p99_tpot"]
    assert all(v <= 0 for k, v in late.constraints.items() if k != "p99_tpot")
    full = LevelMetrics(completed=400, failed=0, p99_ttft_ms=1000.0, p99_tpot_ms=90.0)
    assert score_trial([score_level(full, SLO, 0.25)]).constraints["p99_tpot"] == 1.0
    # the least-violated level speaks for the trial, by the same margins
    both = score_trial([score_level(stopped(20, 45.2), SLO, 0.5), score_level(full, SLO, 0.25)])
    assert both.constraints["p99_tpot"] == pytest.approx(381 / 400)


def test_watch_counts_what_the_records_say(workload: Any) -> None:
    """Run to the end with a watch that never stops: its counts are the records'."""
    reqs = sim_requests(scale_rate(workload, 8.0))
    watch = SimWatch(StopRule(1000.0, 45.0), len(reqs))
    calls = 0

    def never(eng: Engine, now: float) -> bool:
        nonlocal calls
        calls += 1
        watch(eng, now)
        return False

    res = simulate(MODEL, HW, ARGS_ENGINE, reqs, seed=1, stop=never)
    assert res.stopped_at is None and calls > 0
    recs, _ = records_from_sim(res)
    ok = [r for r in recs if r.success]
    assert watch.tally.tpot_over == sum(r.output_tokens > 1 and r.tpot * 1e3 > 45 for r in ok)
    assert watch.tally.ttft_over == sum(r.ttft is not None and r.ttft * 1e3 > 1000 for r in ok)
    assert watch.tally.ttft_over > 0 and watch.tally.tpot_over > 0


def test_stop_hook_ends_the_replay_and_leaves_the_rest_unfinished(workload: Any) -> None:
    reqs = sim_requests(scale_rate(workload, 2.0))
    full = simulate(MODEL, HW, ARGS_ENGINE, reqs, seed=1)
    cut = simulate(MODEL, HW, ARGS_ENGINE, reqs, seed=1, stop=lambda e, _t: e.step_idx >= 200)
    assert full.stopped_at is None and full.end == max(r.finish for r in full.requests)
    assert cut.num_steps == 200 and cut.stopped_at == cut.end < full.end
    assert any(math.isnan(r.finish) for r in cut.requests)
    assert len(records_from_sim(cut)[0]) < len(reqs)  # unfinished ones have no record
    closed = simulate(MODEL, HW, ARGS_ENGINE, reqs, concurrency=8, stop=lambda e, _t: True)
    # asked once the first requests reached the engine, before any step
    assert closed.num_steps == 0 and closed.stopped_at == closed.end
    assert all(math.isnan(r.finish) for r in closed.requests)


# -- the config switch and the stored record ------------------------------------------------
@pytest.mark.config_field("strategy.early_stop")
def test_config_switch_and_what_a_stopped_level_records(tmp_path: Path) -> None:
    on, _ = config(workload={"num_prompts": 400})
    off, _ = config(workload={"num_prompts": 400}, strategy={"early_stop": False})
    wl = build_workload(on.workload, vocab_size=MODEL.vocab_size)
    fixed, _ = config(mode="fixed-rate")
    assert rule_of(on) == StopRule(3000.0, 45.0, 0.0, 0.01)
    assert rule_of(off) is None and rule_of(fixed) is None  # one level is the whole result
    http, _ = config(worker={"kind": "sim", "workdir": str(tmp_path / "w")})
    runner = make_runner(http, MODEL, HW, tmp_path)
    assert isinstance(runner, HttpRunner) and runner.early_stop == rule_of(on)
    runs = {}
    for name, cfg in (("on", on), ("off", off)):
        r = make_runner(cfg, MODEL, HW, tmp_path)
        assert isinstance(r, VirtualRunner)

        async def go(r: VirtualRunner = r) -> Any:
            await r.start(ARGS, "t")
            return await r.run_level(wl, 8.0)

        runs[name] = asyncio.run(go())
    m_on, m_off = runs["on"].metrics, runs["off"].metrics
    assert m_off.stop is None and m_off.total == 400
    assert "early_stop" not in m_on.summary  # the summary holds only bench keys
    stored = level_record(0, runs["on"], score_level(m_on, SLO, 8.0)).metrics
    assert StopInfo.of(stored) == m_on.stop  # what the level row's metrics column holds
    stop = stored["early_stop"]  # in the shape stored before the stop was typed
    assert stop["reason"] in ("p99_ttft", "p99_tpot") and stop["planned_requests"] == 400
    assert 0 < stop["at_request"] < 400 and stop["saved_s_at_least"] > 0
    assert set(stop) == {"reason", "at_request", "planned_requests", "replay_s"} | {
        "saved_s_at_least",
        "bound",
    }
    assert replay_seconds(stored) == runs["on"].replay_s
    assert runs["on"].replay_s < 0.5 * runs["off"].replay_s
    assert not score_level(m_on, SLO, 8.0).feasible
    assert not score_level(m_off, SLO, 8.0).feasible


# -- HTTP replays -------------------------------------------------------------------------
async def test_http_replay_stops_once_requests_in_flight_age_past_the_ttft_slo(
    fake: Fake,
) -> None:
    specs = [Spec(f"ok{i}", arrival=0.0) for i in range(10)]
    specs += [Spec(f"h{i}", prompt_text="hang", arrival=0.0) for i in range(10)]
    rule = StopRule(p99_ttft_ms=200.0)
    wall = time.perf_counter()
    res = await run_load(
        fake.url, specs, LoadOptions(model="tiny", early_stop=rule, drain_timeout=5.0)
    )
    assert time.perf_counter() - wall < 1.5  # not the 5 s drain of the hung requests
    stop = res.early_stop
    assert stop is not None and stop.reason == "p99_ttft"
    assert [r.request_id for r in res.records] == [f"ok{i}" for i in range(10)]
    s = res.summary
    assert s["completed"] == 10 and s["failed"] == 0 and s["p99_ttft_ms"] > 200.0
    assert not score_level(LevelMetrics.from_summary(s, stop), Slo(p99_ttft_ms=200.0)).feasible


async def test_http_replay_stops_at_the_first_error_beyond_the_limit(
    fake: Fake,
) -> None:
    specs = [Spec("e", prompt_text="500", arrival=0.0)]
    specs += [Spec(f"t{i}", arrival=0.1 * i) for i in range(1, 20)]  # 0.1 .. 1.9 s
    wall = time.perf_counter()
    res = await run_load(fake.url, specs, LoadOptions(model="tiny", early_stop=StopRule()))
    assert time.perf_counter() - wall < 1.0
    assert res.early_stop is not None and res.early_stop.reason == "error_rate"
    assert res.summary["errors_by_kind"] == {"http_500": 1} and len(res.records) < 5
    plain = await run_load(fake.url, specs[:3], LoadOptions(model="tiny"))
    assert plain.early_stop is None and len(plain.records) == 3


async def test_http_replay_observed_runs_to_its_end_and_notes_where_it_would_stop(
    fake: Fake,
) -> None:
    """``observe`` sends every request (the error does not end the run) and notes the stop
    the same rule makes: the first request's error, with 1 request sent; a run that holds
    its limits notes nothing (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler
    sees")."""
    specs = [Spec("e", prompt_text="500", arrival=0.0)]
    specs += [Spec(f"t{i}", arrival=0.05 * i) for i in range(1, 10)]
    res = await run_load(fake.url, specs, LoadOptions(model="tiny", observe=StopRule()))
    assert res.early_stop is None and len(res.records) == 10
    assert res.observed == VerdictAt("error_rate", 1, 10)
    m = LevelMetrics.from_summary(res.summary, res.early_stop, res.observed)
    assert m.verdict == res.observed
    ls = score_level(m, Slo())
    assert not ls.feasible and ls.sampler_margins["error_rate"] == 1.0
    stopped = await run_load(fake.url, specs, LoadOptions(model="tiny", early_stop=StopRule()))
    assert stopped.early_stop is not None and stopped.observed is None
    assert LevelMetrics.from_summary(stopped.summary, stopped.early_stop).verdict == res.observed
    fine = await run_load(fake.url, specs[1:], LoadOptions(model="tiny", observe=StopRule()))
    assert fine.observed is None and len(fine.records) == 9


async def test_over_http_the_level_after_an_early_stop_is_measured_on_a_clean_server(
    tmp_path: Path,
) -> None:
    """The simulator's API server drops a request whose client left, as vLLM's does
    (docs/simulator.md#34-the-api-server): the requests a stopped level had sent are not
    parsed, tokenized and prefilled ahead of the next level's. Before, on the quickstart's
    workload at 5x time scale, the level after the baseline's stopped top level read p99 TTFT
    of 4.3 s at a load where it serves in 0.3 s, and the baseline's search ended near half
    its capacity."""
    from autotune.config import parse_config
    from autotune.workload.sustain import sustain

    root = Path(__file__).resolve().parents[1]
    d = yaml.safe_load((root / "configs" / "quickstart.yaml").read_text())
    d["worker"] = {"kind": "sim", "time_scale": 5, "workdir": str(tmp_path / "w")}
    cfg = parse_config(yaml.safe_dump(d), "quickstart.yaml")
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload, vocab_size=MODEL.vocab_size)
    runner = make_runner(cfg, MODEL, HW, tmp_path)
    await runner.start(
        {"max_model_len": 5376, "max_num_seqs": 256, "max_num_batched_tokens": 2048}, "trial-0000"
    )
    try:
        got = []
        for scale in (15.847, 1.981):
            level = sustain(wl, scale, plan.min_level_s, plan.min_level_requests)
            got.append((await runner.run_level(level, scale)).metrics)
    finally:
        await runner.stop()
    top, next_one = got
    assert top.stop is not None and top.stop.reason == "p99_ttft"  # hundreds left in flight
    # in the in-process simulator this level stops on p99 TPOT with p99 TTFT about 0.2 s
    assert next_one.p99_ttft_ms is not None and next_one.p99_ttft_ms < 1000.0, next_one.stop
