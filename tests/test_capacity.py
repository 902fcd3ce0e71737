"""The capacity lattice and its search, common random numbers, and the honest figures a
study prints: pure logic first, then the trial loop with a scripted fake runner (the
``Runner`` protocol is the seam), then small studies on the in-process simulator."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import NotFoundError
from autotune.failures import FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import jitter_seed
from autotune.store import Store
from autotune.tuning.measure.capacity import CapacitySearch, Lattice
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo
from autotune.tuning.measure.scoring import LevelScore, Violation
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.run import context, controller, create
from autotune.tuning.run.events import Event, LevelStart, TrialDone, TrialStart
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

LAT = Lattice(0.25, 16.0, 0.01)


def truth(lat: Lattice, feasible: Callable[[int], bool]) -> list[int]:
    """Every edge: a feasible point whose next point up is infeasible."""
    return [k for k in range(lat.top) if feasible(k) and not feasible(k + 1)]


def run_search(
    lat: Lattice, feasible: Callable[[int], bool], hint: float | None, cap: int = 64
) -> CapacitySearch:
    s = CapacitySearch(lat, cap, hint)
    while (k := s.next_index()) is not None:
        s.record(k, feasible(k))
    return s


# -- the lattice ---------------------------------------------------------------------------
def test_lattice_points_and_index() -> None:
    assert LAT.top == math.floor(math.log(64) / math.log(1.01))  # 417
    assert LAT.scale(0) == 0.25 and LAT.scale(LAT.top) <= 16.0 < LAT.scale(LAT.top) * 1.01
    assert LAT.index(LAT.scale(123)) == 123 and LAT.index(0.01) == 0 and LAT.index(99) == LAT.top
    with pytest.raises(ValueError):
        LAT.scale(LAT.top + 1)
    with pytest.raises(ValueError):
        Lattice(1.0, 0.5, 0.01)


@given(
    cap=st.floats(0.1, 20.0),
    hint=st.one_of(st.none(), st.floats(0.01, 40.0)),
    res=st.sampled_from([0.005, 0.01, 0.05]),
)
def test_monotone_feasibility_gives_one_lattice_point_whatever_the_start(
    cap: float, hint: float | None, res: float
) -> None:
    lat = Lattice(0.25, 16.0, res)

    def feasible(k: int) -> bool:
        return lat.scale(k) <= cap

    s = run_search(lat, feasible, hint)
    r = s.result()
    edges = truth(lat, feasible)
    if cap < lat.low:
        assert r.status == "below_low" and r.index is None
    elif feasible(lat.top):
        assert r.status == "at_top" and r.index == lat.top
    else:
        assert r.status == "found" and [r.index] == edges
        # both ends of the final bracket were measured
        assert s.measured[r.index] is True and s.measured[r.index + 1] is False
    assert r.converged and r.levels == len(s.measured)
    # without a hint: the top, the middle (the bottom when the middle fails), then bisection
    if hint is None:
        assert r.levels <= 2 + math.ceil(math.log2(lat.top))


def test_without_a_hint_the_bottom_is_measured_only_when_nothing_above_it_holds() -> None:
    # the bottom load replays longest (0.25x the rate: four times the middle's duration): a
    # config feasible in the middle never needs it, nor one feasible anywhere above it (the
    # search bisects towards it as if a point below it held)
    mid = LAT.top // 2
    high = run_search(LAT, lambda k: k <= 300, None)
    assert list(high.measured)[:2] == [LAT.top, mid] and 0 not in high.measured
    assert high.result().index == 300
    low = run_search(LAT, lambda k: k <= 50, None)
    assert list(low.measured)[:3] == [LAT.top, mid, mid // 2]
    assert 0 not in low.measured and low.result().index == 50
    one = run_search(LAT, lambda k: k <= 1, None)  # the bracket [1, 2] needs no bottom either
    assert one.result().index == 1 and 0 not in one.measured
    bottom = run_search(LAT, lambda k: k == 0, None)
    assert bottom.result().index == 0 and bottom.measured[0] is True
    nothing = run_search(LAT, lambda k: False, None)
    assert nothing.result().status == "below_low" and nothing.measured[0] is False
    assert nothing.result().levels == 2 + math.ceil(math.log2(mid))


def test_a_hint_next_to_the_answer_saves_levels() -> None:
    def feasible(k: int) -> bool:
        return k <= 200

    cold = run_search(LAT, feasible, None).result()
    warm = run_search(LAT, feasible, LAT.scale(200)).result()
    assert cold.index == warm.index == 200
    assert warm.levels == 2 and cold.levels == 10


@pytest.mark.parametrize(
    "pattern",
    [
        # a hole below the edge and an island above it: noise near capacity
        lambda k: (k <= 150 and not 140 <= k <= 142) or 180 <= k <= 181,
        lambda k: k % 7 != 3 and k < 300,
        lambda k: (k * 2654435761) % 97 > 40,  # scrambled
    ],
)
def test_non_monotone_feasibility_still_gives_one_defined_answer(
    pattern: Callable[[int], bool],
) -> None:
    for hint in (None, 0.3, 1.0, LAT.scale(150), 5.0, 15.0):
        a = run_search(LAT, pattern, hint)
        b = run_search(LAT, pattern, hint)
        ra = a.result()
        assert ra == b.result() and a.measured == b.measured  # the same answer every time
        if ra.status == "found":
            assert ra.index is not None
            # a measured feasible point whose measured next point up is infeasible
            assert a.measured[ra.index] and a.measured[ra.index + 1] is False
            assert ra.index in truth(LAT, pattern)
        else:
            assert ra.status in ("at_top", "below_low")


def test_budget_and_stop_are_reported() -> None:
    s = run_search(LAT, lambda k: k <= 100, None, cap=4)
    r = s.result()
    assert r.status == "budget" and not r.converged and r.levels == 4
    assert r.index is not None and s.measured[r.index]  # the best measured feasible point
    s2 = CapacitySearch(LAT, 24, None)
    k = s2.next_index()
    assert k is not None
    s2.record(k, False)
    s2.stop()
    assert s2.next_index() is None and s2.result().status == "stopped"
    below = run_search(LAT, lambda k: False, 2.0).result()
    assert below.status == "below_low" and below.index is None


# -- common random numbers -------------------------------------------------------------------
def _wl() -> Workload:
    cfg, _ = config(workload={"num_prompts": 60})
    return build_workload(cfg.workload)


async def test_jitter_streams_do_not_depend_on_level_order() -> None:
    model, hw = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_hardware("A100-80GB")
    wl = _wl()

    async def levels(scales: list[float]) -> dict[float, LevelMetrics]:
        r = VirtualRunner(model, hw, model_name="m", static_args={}, seed=7, jitter_cv=0.05)
        await r.start({"max_num_seqs": 64}, "t")
        return {s: (await r.run_level(wl, s)).metrics for s in scales}

    up = await levels([0.5, 1.0, 2.0])
    down = await levels([2.0, 1.0, 0.5])
    alone = await levels([1.0])
    for s in (0.5, 1.0, 2.0):
        assert up[s] == down[s]
    assert alone[1.0] == up[1.0]
    # the stream is a function of (seed, scale): other seeds and scales draw other jitter
    assert jitter_seed(7, 1.0) != jitter_seed(8, 1.0) != jitter_seed(7, 1.01)
    other = VirtualRunner(model, hw, model_name="m", static_args={}, seed=8, jitter_cv=0.05)
    await other.start({"max_num_seqs": 64}, "t")
    assert (await other.run_level(wl, 1.0)).metrics != up[1.0]


# -- the trial loop with a scripted runner -----------------------------------------------------
class ScriptedRunner:
    """Knows each config's capacity (a scale): feasible exactly at loads up to it."""

    kind = "sim-virtual"

    def __init__(self, capacity: Callable[[Mapping[str, Any]], float]) -> None:
        self.capacity = capacity
        self.args: dict[str, Any] = {}
        self.scales: list[float] = []

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.args = dict(engine_args)
        return StartInfo("vllm serve fake", ["vllm", "serve", "fake"], 0.0, 1000, 10.0)

    async def run_level(
        self, workload: Workload, scale: float, progress: Any = None
    ) -> LevelOutcome:
        self.scales.append(scale)
        ok = scale <= self.capacity(self.args)
        m = LevelMetrics(
            completed=100,
            failed=0,
            p99_ttft_ms=1000.0 if ok else 5000.0,
            p99_tpot_ms=20.0,
            output_throughput=100.0 * scale,
            request_throughput=scale,
        )
        return LevelOutcome(scale, 4.0 * scale, m)

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        pass

    def usage(self) -> None:
        return None


def _capacity(ea: Mapping[str, Any]) -> float:
    """A made-up but fixed capacity per config, between 0.3x and 3.3x."""
    h = (int(ea["max_num_seqs"]) * 31 + int(ea["max_num_batched_tokens"])) % 1000
    return 0.3 + 3.0 * h / 1000


def test_every_trial_and_the_baseline_land_on_their_lattice_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = ScriptedRunner(_capacity)
    monkeypatch.setattr(context, "make_runner", lambda *a, **k: runner)
    cfg, text = config(
        strategy={"name": "joint", "n_trials": 12, "capacity_levels": 24, "capacity_high": 8.0}
    )
    lat = Lattice(cfg.strategy.capacity_low, 8.0, cfg.strategy.capacity_resolution)
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create.create_study(cfg, text, store)
        controller.run_study("t", store)
        trials = store.trials("t")
    assert len(trials) == 12 and trials[0].stage == "baseline"
    for t in trials:
        cap = _capacity(t.engine_args)
        if t.state == "PRUNED":  # settled: below the best capacity before it
            assert t.settled_below is not None and cap < t.settled_below
            continue
        want = lat.scale(max(k for k in range(lat.top + 1) if lat.scale(k) <= cap))
        # the same point whatever ran before: every trial starts at the top of the lattice
        assert t.capacity_scale == pytest.approx(want, rel=1e-12), t.optuna_trial_number
        assert t.levels[0].scale == pytest.approx(lat.scale(lat.top))
        assert t.feasible and t.objective == pytest.approx(100.0 * want)
        # every load tried is a lattice point, and the point above the capacity was measured
        scales = [lv.scale for lv in t.levels]
        assert all(lv.scale == pytest.approx(lat.scale(lat.index(lv.scale))) for lv in t.levels)
        assert any(s == pytest.approx(want * 1.01) for s in scales)
    assert all(s in {lat.scale(k) for k in range(lat.top + 1)} for s in runner.scales)


# -- honest figures on the simulator ------------------------------------------------------------
def test_violation_texts_name_value_and_limit() -> None:
    assert Violation("p99_tpot", 58.0, 50.0).text == "p99 TPOT 58 ms > 50 ms"
    assert Violation("p99_tpot", 45.02, 45.0).text == "p99 TPOT 45.02 ms > 45 ms"
    assert Violation("p99_ttft", 2510.3, 2000.0).text == "p99 TTFT 2,510 ms > 2,000 ms"
    assert Violation("overlength_rate", 0.019, 0.01).text == "over-length 1.9 % > 1 %"
    assert Violation("error_rate", 0.005, 0.0).text == "errors 0.5 % > 0 %"
    assert Violation("preemptions", 3.0, 0.0).text == "preemptions 3 > 0"
    assert Violation("p99_ttft", None, 500.0).text == "p99 TTFT not measured (SLO 500 ms)"


def test_progress_show_and_export_name_each_violation(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    # p99 TPOT 40 ms: feasible at low loads only; max_model_len 512 would cut most requests
    # short, so it is dropped before any launch (docs/tuning.md#8-the-staged-plan)
    _, text = config(
        slo={"p99_ttft_ms": 3000, "p99_tpot_ms": 40},
        search={"max_model_len": {"candidates": [512, 1536]}},
        strategy={"name": "joint", "n_trials": 2, "capacity_levels": 24},
    )
    path.write_text(text)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(app, ["study", "create", "--config", str(path), "--storage", url])
    assert r.exit_code == 0, r.output
    assert re.search(r"plan: max_model_len 512 dropped before any launch: [\d.]+% of the", r.output)
    r = CliRunner().invoke(app, ["study", "run", "t", "--storage", url])
    assert r.exit_code == 0, r.output
    out = r.output
    assert re.search(r"-> p99 TPOT (≥ )?[\d.]+ ms > 40 ms", out), out
    # infeasible levels stop when certain, their p99 a lower bound over the requests sent
    # (docs/tuning.md#10-early-stop-inside-a-level)
    stop = r"-> p99 TPOT ≥ [\d.]+ ms > 40 ms \(stopped early on p99 TPOT at request \d+ of (\d+)\)"
    planned = [int(n) for n in re.findall(stop, out)]
    # of the level's requests: whole copies of the 120-request sample, as many as its load
    # needs to last strategy.min_level_s (docs/tuning.md#13-level-length)
    assert planned and all(n % 120 == 0 for n in planned), out
    # capacity in req/s as well as a scale
    assert re.search(r"output tok/s at x[\d.]+ \([\d.]+ req/s\)", out), out
    show = CliRunner().invoke(app, ["study", "show", "t", "--storage", url]).output
    assert "req/s = capacity" in show and "dropped before any launch" in show
    body = json.loads(
        CliRunner()
        .invoke(app, ["study", "export", "t", "--format", "json", "--storage", url])
        .output
    )
    assert {t["engine_args"]["max_model_len"] for t in body["trials"]} == {1536}
    good = body["trials"][0]
    assert good["capacity_rps"] == pytest.approx(4.0 * good["capacity_scale"], rel=0.05)
    assert any(v["text"].startswith("p99 TPOT") for lv in good["levels"] for v in lv["violations"])
    csv_out = CliRunner().invoke(app, ["study", "export", "t", "--format", "csv", "--storage", url])
    assert "capacity_rps" in csv_out.output.splitlines()[0]
    # a config enqueued with the dropped length is refused at create, with one line
    _, text = config(
        name="u",
        slo={"p99_ttft_ms": 3000, "p99_tpot_ms": 40},
        search={"max_model_len": {"candidates": [512, 1536]}},
        enqueue=[{"max_model_len": 512}],
    )
    path.write_text(text)
    r = CliRunner().invoke(app, ["study", "create", "--config", str(path), "--storage", url])
    assert r.exit_code == 1 and "enqueue[0].max_model_len: 512 is not in the search space" in str(
        r.exception
    )


def test_only_overlength_stops_a_capacity_search() -> None:
    """Requests too long and nothing else wrong: no load helps (over HTTP, where the
    server's tokenizer can make prompts longer than the workload's estimate)."""
    from autotune.tuning.measure.level_plan import only_overlength

    long_ = LevelScore(
        1.0, {"p99_ttft": -0.5, "p99_tpot": -0.2, "overlength_rate": 0.3}, False, 0.0
    )
    both = LevelScore(1.0, {"p99_ttft": 0.5, "p99_tpot": -0.2, "overlength_rate": 0.3}, False, 0.0)
    fine = LevelScore(
        1.0, {"p99_ttft": -0.5, "p99_tpot": -0.2, "overlength_rate": -0.01}, True, 0.0
    )
    assert only_overlength(long_) and not only_overlength(both) and not only_overlength(fine)


def test_nothing_feasible_says_capacity_below_the_lowest_load(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    _, text = config(
        slo={"p99_ttft_ms": 1, "p99_tpot_ms": 45}, strategy={"n_trials": 1, "capacity_levels": 24}
    )
    path.write_text(text)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(
        app, ["study", "create", "--config", str(path), "--storage", url, "--run"]
    )
    # running longer measures the same lattice: the run ends as `best` does (exit 4), saying
    # what to lower instead (docs/tuning.md#1-the-capacity-lattice)
    assert isinstance(r.exception, NotFoundError), r.output  # exit status 4 from autotune's main
    assert "capacity below the lowest load tried (1.00 req/s, x0.250)" in str(r.exception)
    assert "lower strategy.capacity_low to 0.062 or less" in str(r.exception)
    assert "no feasible configuration yet" not in r.output
    best = CliRunner().invoke(app, ["study", "best", "t", "--storage", url])
    assert isinstance(best.exception, NotFoundError)
    assert "capacity below the lowest load tried (1.00 req/s, x0.250)" in str(best.exception)
    assert "lower strategy.capacity_low" in str(best.exception)
    assert "run it longer" not in str(best.exception)


def test_one_replica_short_names_the_replicas_needed(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    # 40 req/s of 512/128-token requests is more than one A100 serves within these SLOs
    _, text = config(workload={"rate": 40}, strategy={"n_trials": 1, "capacity_levels": 24})
    path.write_text(text)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(
        app, ["study", "create", "--config", str(path), "--storage", url, "--run"]
    )
    assert r.exit_code == 0, r.output
    m = re.search(r"at ([\d.]+)x the workload's rate \(([\d.]+) req/s\)", r.output)
    assert m, r.output
    scale = float(m.group(1))
    assert scale < 1.0 and float(m.group(2)) == pytest.approx(40 * scale, rel=0.01)
    n = math.ceil(1 / scale)
    assert f"the traffic needs {n} replicas of this config" in r.output


def test_trial_numbers_are_optunas_after_a_resume(tmp_path: Path) -> None:
    cfg, text = config(strategy={"name": "joint", "n_trials": 4})
    events: list[Event] = []
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create.create_study(cfg, text, store)
        controller.run_study("t", store, n_trials=2)

        def interrupt(e: Event) -> None:
            if isinstance(e, LevelStart):
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            controller.run_study("t", store, on_event=interrupt)
        controller.run_study("t", store, on_event=events.append)
        trials = store.trials("t")
    starts = [e for e in events if isinstance(e, TrialStart)]
    # trial 2 was interrupted (FAIL): the resumed run goes on with Optuna's 3 and 4, the
    # 3rd and 4th complete trials of a plan of 4, never "trial 5 of 4"
    assert [e.number for e in starts] == [3, 4]
    assert [e.position for e in starts] == [(3, 4), (4, 4)]
    assert [t.optuna_trial_number for t in trials] == [0, 1, 2, 3, 4]
    assert trials[2].state == "FAIL"
    done = [e for e in events if isinstance(e, TrialDone)]
    assert [e.number for e in done] == [3, 4]
