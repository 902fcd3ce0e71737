"""The validation phase (autotune/tuning/measure/validate.py) with a scripted runner whose noise is
known: it picks the best lower bound, says "keep" when nothing is better, interleaves its
runs on fresh workload samples, counts against the run's time limit and resumes; then a small
study on the in-process simulator through the controller and the CLI."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.runners import KeepableNoisyRunner, NoisyRunner
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.report.best_output import format_recommendation
from autotune.report.recommend import recommend
from autotune.store import RepeatRecord, Store, StudyRecord, TrialRecord
from autotune.tuning.measure import validate
from autotune.tuning.measure.candidates import runs_can_rank, start_of
from autotune.tuning.measure.interval import summary_of
from autotune.tuning.measure.noise import NoiseRecord, NoiseRun, band_of
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo
from autotune.tuning.measure.validate import run_validation
from autotune.tuning.run import context, controller, create, lanes
from autotune.tuning.study_attrs import VALIDATION_KEY
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

field = pytest.mark.config_field


def _cfg(**strategy: Any) -> Any:
    """A study config; its validation runs every planned repeat unless ``validate`` sets
    ``stop_early`` (the tests of the plan's mechanics count every run)."""
    st = {"capacity_levels": 24, "capacity_high": 4.0, **strategy}
    st["validate"] = {"stop_early": False, **st.get("validate", {})}
    return config(strategy=st)[0]


def _study(store: Store, cfg: Any, objectives: Mapping[int, float]) -> None:
    """A finished search: trial n ran config max_num_seqs=n (0: the baseline)."""
    store.create_study(StudyRecord("t", "name: t\n", {}, cfg.mode, "sim-virtual", "t"))
    for n, obj in objectives.items():
        store.add_trial(
            TrialRecord(
                study_name="t",
                optuna_trial_number=n,
                stage="baseline" if n == 0 else "joint",
                state="COMPLETE",
                params={},
                engine_args={"max_num_seqs": n},
                launch_command=None,
                launch_argv=None,
                worker_kind="sim-virtual",
                objective=obj,
                feasible=True,
            )
        )


def _validate(store: Store, cfg: Any, spec: Mapping[int, tuple[float, float]], **kw: Any) -> Any:
    """The phase on ``runner`` (default :class:`NoisyRunner`) workers, logging to ``log``."""
    log: list[Any] = kw.pop("log", [])
    runner: Callable[..., Any] = kw.pop("runner", NoisyRunner)
    return asyncio.run(
        run_validation(
            cfg,
            store,
            "t",
            make_runner=lambda seed: runner(seed, spec, log),
            vocab_size=32000,
            **kw,
        )
    )


def test_picks_the_best_lower_bound_not_the_luckiest_run(tmp_path: Path) -> None:
    # config 1 won the study by luck and is the noisiest: its re-measurements have the best
    # mean and the luckiest single run, but a lower bound far below config 2's
    spec = {0: (1.0, 0.01), 1: (1.30, 0.25), 2: (1.20, 0.01), 3: (1.10, 0.01)}
    cfg = _cfg(validate={"top_k": 3, "repeats": 3})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 200.0, 2: 150.0, 3: 140.0})
        out = _validate(store, cfg, spec)
        repeats = store.repeats("t")
        trials = store.trials("t")
    assert out.runs == 12 and out.stopped_by is None
    s = out.summary
    assert s.complete and (s.verdict, s.chosen) == ("recommend", 2)
    lucky = max((r for r in repeats if r.role == "candidate"), key=lambda r: r.capacity_scale)
    one, two = s.candidate(1).interval, s.candidate(2).interval
    assert lucky.trial_number == 1 and one.mean > two.mean
    assert one.low < 0 < two.low
    assert recommend(cfg, trials).trial.optuna_trial_number == 1  # the study's own pick
    rec = recommend(cfg, trials, repeats)
    assert rec is not None and rec.trial.optuna_trial_number == 2 and not rec.keep
    text = format_recommendation(rec)
    assert "validated gain in SLO capacity over the baseline: +" in text
    assert "(95 % CI +" in text and "3 paired runs)" in text


def test_keep_when_the_true_gain_is_zero(tmp_path: Path) -> None:
    spec = {n: (1.0, 0.02) for n in range(4)}
    cfg = _cfg(validate={"top_k": 3, "repeats": 3})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 104.0, 2: 103.0, 3: 102.0})
        out = _validate(store, cfg, spec)
        rec = recommend(cfg, store.trials("t"), store.repeats("t"))
    assert (out.summary.verdict, out.summary.chosen) == ("keep", None)
    assert rec is not None and rec.keep and rec.trial.stage == "baseline"
    text = format_recommendation(rec)
    assert "keep your current config: no candidate beats it beyond noise" in text
    # each re-measured config's validated capacity, runs held and gain interval
    assert "  baseline, trial 0: the SLOs held in 4 of 4 runs; validated capacity x" in text
    best = next(ln for ln in text.splitlines() if ln.startswith(f"  trial {out.summary.best}: "))
    assert "validated capacity x" in best and "SLO capacity over the baseline" in best
    assert "95 % CI" in best and "3 paired runs)" in best


@field("strategy.validate.top_k")
@field("strategy.validate.repeats")
def test_runs_are_interleaved_on_fresh_samples_of_the_workload(tmp_path: Path) -> None:
    spec = {n: (1.0 + n / 10, 0.01) for n in range(5)}
    # levels replay the sample as it is (no loop to a minimum length, which would give each
    # load its own longer workload, docs/tuning.md#13-level-length): the fingerprints the
    # runner logs are then the samples'
    cfg = _cfg(validate={"top_k": 2, "repeats": 3}, min_level_s=0, min_level_requests=0)
    log: list[Any] = []
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 110.0, 2: 120.0, 3: 130.0, 4: 90.0})
        _validate(store, cfg, spec, log=log)
        repeats = store.repeats("t")
    # top_k = 2: the two best configs besides the baseline, three repeats each
    assert sorted({r.trial_number for r in repeats}) == [0, 2, 3] and len(repeats) == 9
    starts = [k for kind, k, *_ in log if kind == "start"]
    # each repeat runs every config once, the order reversed from one repeat to the next so
    # that drift hits all alike (docs/tuning.md#7-validation, "One worker for a block of runs")
    assert starts == [0, 3, 2, 2, 3, 0, 0, 3, 2]
    prints = {}
    for kind, key, *rest in log:
        if kind == "level":
            prints.setdefault(
                len([s for s in log[: log.index((kind, key, *rest))] if s[0] == "start"]), set()
            ).add(rest[0])
    per_run = [next(iter(v)) for _, v in sorted(prints.items())]
    assert all(len(v) == 1 for v in prints.values())
    # runs of one repeat share one sample (they pair up); repeats and the study differ
    samples = [set(per_run[i : i + 3]) for i in range(0, 9, 3)]
    assert all(len(s) == 1 for s in samples)
    study_print = build_workload(cfg.workload, vocab_size=32000).fingerprint()
    assert len(set.union(*samples) | {study_print}) == 4
    assert {r.sample for r in repeats} == {f"workload seed {r.workload_seed}" for r in repeats}


def test_configs_measured_alike_are_validated_once(tmp_path: Path) -> None:
    # trials 2 and 4 measured exactly as trial 1 and the baseline did (on the simulator:
    # engine args that change nothing the engine does); validating them would spend the
    # runs on behaviours already planned, so the top 2 are trials 1 and 3
    cfg = _cfg(validate={"top_k": 2, "repeats": 2})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 120.0, 2: 120.0, 3: 110.0, 4: 100.0, 5: 90.0})
        trials = store.trials("t")
        base, top = validate.candidates_of(trials, 2)
        _validate(store, cfg, {n: (1.0 + n / 10, 0.01) for n in range(6)})
        planned = {r.trial_number for r in store.repeats("t")}
    assert base is not None and base.optuna_trial_number == 0
    assert [t.optuna_trial_number for t in top] == [1, 3]
    assert planned == {0, 1, 3}
    by = {t.optuna_trial_number: t for t in trials}
    assert validate.measured_alike(by[1], by[2]) and not validate.measured_alike(by[1], by[3])
    # a level that differs in any figure makes two trials different
    lv = types.SimpleNamespace(
        scale=1.0, feasible=True, p99_ttft_ms=100.0, p99_tpot_ms=20.0, output_throughput=5.0
    )
    by[2].levels = [lv]
    assert not validate.measured_alike(by[1], by[2])
    by[1].levels = [types.SimpleNamespace(**{**vars(lv), "p99_ttft_ms": 100.5})]
    assert not validate.measured_alike(by[1], by[2])
    by[1].levels = [types.SimpleNamespace(**vars(lv))]
    assert validate.measured_alike(by[1], by[2])
    # an infeasible level's figures are not compared (with early stop they come from a
    # partial replay), its load and verdict are
    bad = {**vars(lv), "feasible": False, "p99_ttft_ms": 9000.0}
    by[1].levels.append(types.SimpleNamespace(**bad))
    by[2].levels.append(types.SimpleNamespace(**{**bad, "p99_ttft_ms": 9500.0}))
    assert validate.measured_alike(by[1], by[2])
    by[2].levels[-1].scale = 1.01
    assert not validate.measured_alike(by[1], by[2])
    # loads only one of them measured are not compared (a trial settled upwards from the
    # best so far measures fewer), the capacity point must be among those both measured
    by[2].levels = [types.SimpleNamespace(**vars(lv))]
    by[1].levels = [types.SimpleNamespace(**{**vars(lv), "scale": 0.5}), *by[2].levels]
    assert validate.measured_alike(by[1], by[2])
    by[1].capacity_scale = by[2].capacity_scale = 0.5
    assert not validate.measured_alike(by[1], by[2])


def test_a_deadline_stops_it_and_the_next_call_resumes(tmp_path: Path) -> None:
    spec = {n: (1.0 + n / 10, 0.01) for n in range(3)}
    cfg = _cfg(validate={"top_k": 2, "repeats": 2})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 110.0, 2: 120.0})
        first = _validate(store, cfg, spec, deadline=0.0)  # already past
        assert (first.runs, first.stopped_by) == (0, "timeout")
        assert first.summary is not None and first.summary.verdict is None
        assert {r.state for r in store.repeats("t")} == {"PENDING"}

        class Stop(KeyboardInterrupt):
            pass

        calls = {"starts": 0, "levels": 0}

        class Interrupting(NoisyRunner):
            async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
                calls["starts"] += 1
                calls["levels"] = 0
                return await super().start(engine_args, trial_name)

            async def run_level(
                self, workload: Workload, scale: float, progress: Any = None
            ) -> LevelOutcome:
                calls["levels"] += 1
                if calls["starts"] == 3 and calls["levels"] == 3:  # in the third run
                    raise Stop
                return await super().run_level(workload, scale, progress)

        with pytest.raises(Stop):
            asyncio.run(
                run_validation(
                    cfg,
                    store,
                    "t",
                    make_runner=lambda seed: Interrupting(seed, spec, []),
                    vocab_size=32000,
                )
            )
        states = [r.state for r in store.repeats("t")]
        assert states == ["COMPLETE", "COMPLETE", "PENDING", "PENDING", "PENDING", "PENDING"]
        rest = _validate(store, cfg, spec)
        assert rest.runs == 4 and rest.summary.complete
        assert rest.summary.verdict == "recommend" and rest.summary.chosen == 2


@pytest.mark.parametrize(
    ("mode", "figure", "gain"),
    [
        ("slo-capacity", "SLO capacity", 20.0),  # 1.2x vs 1.0x on the lattice
        ("fixed-rate", "worst SLO margin", 20.0),  # p99 TTFT 1250 vs 1500 ms of 3000 ms
        ("offline", "throughput", 20.0),  # 1200 vs 1000 tok/s
    ],
)
def test_the_gain_of_each_mode(tmp_path: Path, mode: str, figure: str, gain: float) -> None:
    spec = {0: (1.0, 0.0), 1: (1.2, 0.0)}
    over: dict[str, Any] = {"mode": mode}
    if mode == "offline":
        over |= {"workload": {"arrival": "closed", "concurrency": 8, "rate": None}}
    # five repeats in every mode (one-level modes default to 20): the floor's width below
    cfg, _ = config(
        strategy={"capacity_levels": 24, "validate": {"top_k": 1, "repeats": 5}}, **over
    )
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 120.0})
        s = _validate(store, cfg, spec).summary
    iv = s.candidate(1).interval
    assert s.figure == figure
    # noise-free repeats tie exactly: the interval is the floor's, never of zero width
    assert iv.mean == pytest.approx(gain, abs=1.0 if mode == "slo-capacity" else 1e-6)
    assert iv.sd == pytest.approx(0.0, abs=1e-9) and iv.high - iv.low > 1.0
    assert s.verdict == "recommend"


@field("strategy.validate.confidence")
def test_the_confidence_level_sets_the_interval(tmp_path: Path) -> None:
    spec = {0: (1.0, 0.02), 1: (1.1, 0.02)}
    cfg = _cfg(validate={"top_k": 1, "repeats": 4})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 120.0})
        _validate(store, cfg, spec)
        repeats = store.repeats("t")
    wide = summary_of(cfg, repeats).candidate(1).interval
    narrow = (
        summary_of(_cfg(validate={"top_k": 1, "confidence": 0.5}), repeats).candidate(1).interval
    )
    assert wide.mean == narrow.mean and narrow.low > wide.low and narrow.high < wide.high
    assert (wide.confidence, narrow.confidence) == (0.95, 0.5)


@field("strategy.validate.enabled")
def test_validation_off_leaves_the_studys_answer_not_validated(tmp_path: Path) -> None:
    _, text = config(strategy={"name": "joint", "n_trials": 3, "validate": {"enabled": False}})
    path = tmp_path / "s.yaml"
    path.write_text(text)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(
        app, ["study", "create", "--config", str(path), "--storage", url, "--run"]
    )
    assert r.exit_code == 0, r.output
    assert "validation:" not in r.output.split("3 trial(s) run")[0]  # no phase ran
    with Store.open(url) as store:
        assert store.repeats("t") == []
    best = CliRunner().invoke(app, ["study", "best", "t", "--storage", url])
    assert "validation: not validated (strategy.validate: off)" in best.output


def test_a_study_validates_after_its_search_within_its_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the controller: the phase runs once the plan is complete, its time counts
    against the run's limit (a clock advanced one second per level), and a later run
    finishes it; its runs are not Optuna trials, and the summary is a study attribute."""
    clock = {"t": 0.0}
    fake = types.SimpleNamespace(monotonic=lambda: clock["t"])
    monkeypatch.setattr(controller, "time", fake)
    monkeypatch.setattr(validate, "time", fake)
    monkeypatch.setattr(lanes, "time", fake)  # the run's budget clock

    class Timed(NoisyRunner):
        async def run_level(
            self, workload: Workload, scale: float, progress: Any = None
        ) -> LevelOutcome:
            clock["t"] += 1.0
            return await super().run_level(workload, scale, progress)

    spec: dict[int, tuple[float, float]] = {}

    def runner(cfg: Any, *_: Any, **__: Any) -> Timed:
        return Timed(cfg.seed, spec, [])

    monkeypatch.setattr(context, "make_runner", runner)
    cfg, text = config(
        strategy={
            "name": "joint",
            "n_trials": 4,
            "capacity_levels": 4,
            "validate": {"top_k": 2, "repeats": 2},
        }
    )
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create.create_study(cfg, text, store)
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        # every config the sampler picks gets a capacity from its max_num_seqs
        spec.update({n: (0.5 + n / 512, 0.01) for n in range(1, 4097)})
        first = controller.run_study("t", store, timeout=4 * 4 + 10)  # the search, then 10 s
        assert first.trials_run == 4 and first.stopped_by == "timeout"
        # 2 repeats of the baseline and the best, and of a runner-up unless the runs could not
        # rank it (docs/tuning.md#7-validation, "Which configs")
        planned = len(store.repeats("t"))
        assert planned in (4, 6) and 0 < first.validation_runs < planned
        second = controller.run_study("t", store)
        assert (second.trials_run, second.stopped_by) == (0, "plan complete")
        assert first.validation_runs + second.validation_runs == planned
        assert len(study.trials) == 4  # re-measurements are not trials
        attr = optuna.load_study(study_name="t", storage=store.optuna_storage()).user_attrs[
            VALIDATION_KEY
        ]
        assert attr["complete"] and attr["runs_done"] == planned
        assert attr["verdict"] in ("recommend", "keep")


def test_study_best_and_export_carry_the_interval(tmp_path: Path) -> None:
    """The default phase on the in-process simulator, through the CLI."""
    # max_model_len is sized from 120 requests here: allow what other samples of them cut
    _, text = config(
        strategy={"name": "joint", "n_trials": 4, "validate": {"top_k": 1, "repeats": 2}},
        slo={"max_overlength_rate": 0.05},
    )
    path = tmp_path / "s.yaml"
    path.write_text(text)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    run = CliRunner().invoke(
        app, ["study", "create", "--config", str(path), "--storage", url, "--run"]
    )
    assert run.exit_code == 0, run.output
    assert "validation: re-measuring the top configs" in run.output
    assert "repeat 1 trial 0 [baseline] (" in run.output
    best = CliRunner().invoke(app, ["study", "best", "t", "--storage", url])
    # both configs hold at the top of the range: a +0.0 % gain, inside the server's noise
    # band (the simulator's jitter, about 0.5 %): too noisy to tell, no command, exit 4 as
    # for "undecided" (docs/tuning.md#7-validation)
    assert best.exit_code == 4, best.output
    assert "too noisy to tell on this server" in best.output.splitlines()[0]
    assert "vllm serve" not in best.output
    lines = [ln for ln in best.output.splitlines() if "95 % CI" in ln]
    assert len(lines) == 1 and "2 paired runs)" in lines[0], best.output
    exp = CliRunner().invoke(app, ["study", "export", "t", "--format", "json", "--storage", url])
    body = json.loads(exp.output)
    v = body["validation"]
    assert len(v["runs"]) == 4 and {r["state"] for r in v["runs"]} == {"COMPLETE"}
    cand = v["summary"]["candidates"][0]
    low, high = cand["interval"]["low"], cand["interval"]["high"]
    assert f"{low:+.1f} … {high:+.1f} %" in lines[0]
    csv_out = CliRunner().invoke(app, ["study", "export", "t", "--format", "csv", "--storage", url])
    head, *rows = csv_out.output.splitlines()
    tail = ("gain_pct", "ci_low_pct", "ci_high_pct", "paired_runs", "slo_held")
    assert head.endswith(",".join(f"validated_{c}" for c in tail))
    assert sum(1 for r in rows if r.endswith(",2,2/2")) == 1


def test_a_killed_controllers_run_is_measured_again_after_fail_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {n: (0.5 + n / 512, 0.01) for n in range(1, 4097)}
    monkeypatch.setattr(
        context, "make_runner", lambda cfg, *_, **__: NoisyRunner(cfg.seed, spec, [])
    )
    cfg, text = config(
        strategy={
            "name": "joint",
            "n_trials": 3,
            "capacity_levels": 4,
            "validate": {"top_k": 1, "repeats": 3},
        }
    )
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create.create_study(cfg, text, store)
        assert controller.run_study("t", store).validation_runs == 6
        stuck = store.repeats("t")[2]
        assert stuck.id is not None
        store.update_repeat(stuck.id, state="RUNNING")  # as a controller killed mid-run leaves it
        rec = recommend(cfg, store.trials("t"), store.repeats("t"))
        assert rec is not None and not rec.validated
        assert "incomplete: 5 of 6 runs" in format_recommendation(rec)
        assert controller.run_study("t", store).validation_runs == 0  # never implicit
        assert controller.run_study("t", store, reset_running=True).validation_runs == 1
        rec = recommend(cfg, store.trials("t"), store.repeats("t"))
        assert rec is not None and rec.validated


def test_an_infeasible_baseline_gets_no_gain_but_a_recommendation(tmp_path: Path) -> None:
    spec = {0: (0.1, 0.01), 1: (1.1, 0.01), 2: (1.3, 0.01)}  # the baseline: below the lattice
    cfg = _cfg(validate={"top_k": 2, "repeats": 2})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 120.0, 2: 110.0})
        out = _validate(store, cfg, spec)
        rec = recommend(cfg, store.trials("t"), store.repeats("t"))
    assert (out.summary.verdict, out.summary.chosen, out.summary.baseline_held) == (
        "no-baseline",
        2,
        0,
    )
    assert rec is not None and rec.trial.optuna_trial_number == 2
    text = format_recommendation(rec)
    # the baseline held in the study (scripted feasible) and in none of its 2 repeats
    assert "the current config breaks the SLOs: it held them only in 1 of 3 runs; trial 2" in text


@field("strategy.validate.repeats")
def test_repeats_default_by_mode_and_the_plan_follows(tmp_path: Path) -> None:
    # a capacity search per run in slo-capacity mode (5 repeats); one level per run in
    # offline and fixed-rate mode, so 20 repeats cost less and narrow a noisier figure
    capacity = _cfg()
    offline = config(
        mode="offline",
        workload={"arrival": "closed", "concurrency": 8, "rate": None},
        slo={"p99_ttft_ms": None, "p99_tpot_ms": None},
    )[0]
    fixed = config(mode="fixed-rate")[0]
    assert capacity.strategy.validate_.repeats is None
    assert [c.validation_repeats for c in (capacity, offline, fixed)] == [5, 20, 20]
    # a repeats value the user sets wins in every mode
    assert (
        config(mode="fixed-rate", strategy={"validate": {"repeats": 3}})[0].validation_repeats == 3
    )
    for cfg, n in ((capacity, 5), (offline, 20)):
        with Store.open(f"sqlite:///{tmp_path / (cfg.mode + '.db')}") as store:
            _study(store, cfg, {0: 100.0, 1: 110.0, 2: 120.0})
            trials = store.trials("t")
            base, top = validate.candidates_of(trials, 2)
            assert base is not None
            runs = validate.plan_runs(cfg, base, top)
        assert len(runs) == 3 * n and max(r.repeat_index for r in runs) == n - 1


@field("strategy.validate.from_capacity")
def test_runs_start_at_each_configs_capacity_and_find_the_same_answers(tmp_path: Path) -> None:
    # the decision boundary: each run's search starts at its config's capacity in the study
    # (docs/tuning.md#7-validation) and ends on the same lattice points as a search from the
    # lattice's ends, in fewer levels when the capacity moved little on the fresh sample
    spec = {0: (1.0, 0.01), 1: (1.3, 0.01)}
    results = {}
    for on in (True, False):
        cfg = _cfg(validate={"top_k": 1, "repeats": 3, "from_capacity": on})
        with Store.open(f"sqlite:///{tmp_path / f'{on}.db'}") as store:
            _study(store, cfg, {0: 100.0, 1: 130.0})
            for t in store.trials("t"):
                assert t.id is not None
                store.update_trial(t.id, capacity_scale=spec[t.optuna_trial_number][0])
            out = _validate(store, cfg, spec)
            results[on] = (out.summary, store.repeats("t"))
    (s_on, r_on), (s_off, r_off) = results[True], results[False]
    key = lambda r: (r.repeat_index, r.trial_number)  # noqa: E731
    assert [r.capacity_scale for r in sorted(r_on, key=key)] == [
        r.capacity_scale for r in sorted(r_off, key=key)
    ]
    assert s_on.verdict == s_off.verdict == "recommend" and s_on.chosen == s_off.chosen == 1
    assert sum(r.levels or 0 for r in r_on) < sum(r.levels or 0 for r in r_off) / 2


def _run(
    repeat: int, trial: int, role: str, cap: float | None, state: str = "COMPLETE"
) -> RepeatRecord:
    return RepeatRecord(
        study_name="t",
        repeat_index=repeat,
        position=0,
        trial_number=trial,
        role=role,
        engine_args={},
        sample="s",
        workload_seed=0,
        jitter_seed=0,
        state=state,
        slo_held=cap is not None,
        capacity_scale=cap,
    )


def test_a_candidates_run_starts_where_its_repeats_sample_moved_the_other_candidates() -> None:
    # docs/tuning.md#7-validation, "Where a run starts": the candidates of one repeat share a
    # sample and move together; the baseline moves on its own and never moves them
    study = {0: 1.6, 15: 2.0, 20: 2.1}
    me = _run(1, 20, "candidate", None, state="PENDING")
    # nothing measured on this sample yet: the study capacity
    assert start_of(me, study, []) == 2.1
    runs = [
        _run(1, 0, "baseline", 1.76),  # the baseline moved +10 %: not a candidate's move
        _run(0, 15, "candidate", 1.0),  # another repeat's sample
        _run(1, 15, "candidate", 1.8, state="RUNNING"),  # not finished
    ]
    assert start_of(me, study, runs) == 2.1
    runs.append(_run(1, 15, "candidate", 1.8))  # this sample moved trial 15 by -10 %
    assert start_of(me, study, runs) == pytest.approx(2.1 * 0.9)
    # a candidate that failed on the sample says nothing about where the capacity moved
    assert start_of(me, study, [_run(1, 15, "candidate", None)]) == 2.1
    # no study capacity: no start (the search runs from the lattice's ends)
    assert start_of(me, {}, runs) is None


@field("strategy.validate.top_k")
def test_a_runner_up_the_study_told_apart_is_not_re_measured(tmp_path: Path) -> None:
    # docs/tuning.md#7-validation, "Which configs": trial 2's capacity lies 3 % below trial
    # 1's; against a noise band of 0.5 % plus one 1 % step the study told them apart, so only
    # trial 1 and the baseline are re-measured, and progress says why. With a band of 3 %
    # (or none measured) both candidates are
    spec = {0: (1.0, 0.01), 1: (1.3, 0.01), 2: (1.26, 0.01)}
    caps = {0: 1.0, 1: 1.3, 2: 1.3 / 1.03}
    seen: dict[Any, set[int]] = {}
    for band in (0.5, 3.0, None):
        cfg = _cfg(validate={"top_k": 2, "repeats": 2})
        with Store.open(f"sqlite:///{tmp_path / f'{band}.db'}") as store:
            _study(store, cfg, {0: 100.0, 1: 130.0, 2: 126.0})
            for t in store.trials("t"):
                assert t.id is not None
                store.update_trial(t.id, capacity_scale=caps[t.optuna_trial_number])
            noise = None if band is None else _noise(band)
            events: list[Any] = []
            _validate(store, cfg, spec, noise=noise, on_event=events.append)
            seen[band] = {r.trial_number for r in store.repeats("t")}
            start = next(e for e in events if type(e).__name__ == "ValidationStart")
            if band == 0.5:
                assert (
                    len(start.told_apart) == 1
                    and "trial 2 (capacity x1.262" in (start.told_apart[0])
                )
            else:
                assert start.told_apart == ()
    assert seen[0.5] == {0, 1}
    assert seen[3.0] == seen[None] == {0, 1, 2}


@field("strategy.validate.top_k")
@pytest.mark.parametrize("mode", ["slo-capacity", "offline"])
def test_a_runner_up_whose_lead_the_runs_cannot_resolve_is_not_re_measured(
    tmp_path: Path, mode: str
) -> None:
    # docs/tuning.md#7-validation, "Which configs": trial 2 ties trial 1 in the study. On a
    # server whose noise band is 0.5 %, below one 1 % step, it can lead trial 1 by less than
    # a run resolves (two steps for a capacity run, one for a one-level run), so only trial 1
    # and the baseline are re-measured and progress says why. With a band of 1.5 % the runs
    # could rank them, so both are
    spec = {0: (1.0, 0.01), 1: (1.3, 0.01), 2: (1.3, 0.01)}
    seen: dict[float, set[int]] = {}
    for band in (0.5, 1.5):
        over: dict[str, Any] = {"mode": mode}
        if mode == "offline":
            over |= {"workload": {"arrival": "closed", "concurrency": 8, "rate": None}}
        st = {"capacity_levels": 24, "capacity_high": 4.0}
        cfg = config(strategy=st | {"validate": {"top_k": 2, "repeats": 2}}, **over)[0]
        with Store.open(f"sqlite:///{tmp_path / f'{mode}{band}.db'}") as store:
            _study(store, cfg, {0: 100.0, 1: 130.0, 2: 129.9})
            for t in store.trials("t"):
                assert t.id is not None
                store.update_trial(t.id, capacity_scale=1.3 if t.optuna_trial_number else 1.0)
            events: list[Any] = []
            _validate(store, cfg, spec, noise=_noise(band), on_event=events.append)
            seen[band] = {r.trial_number for r in store.repeats("t")}
            start = next(e for e in events if type(e).__name__ == "ValidationStart")
            if band == 0.5:
                assert len(start.told_apart) == 1 and start.told_apart[0].startswith("trial 2 (")
                assert "the runs could not rank them" in start.told_apart[0]
            else:
                assert start.told_apart == ()
    assert seen[0.5] == {0, 1}
    assert seen[1.5] == {0, 1, 2}


def test_the_runs_rank_a_runner_up_only_on_a_server_noisy_by_a_step() -> None:
    # docs/tuning.md#7-validation, "Which configs": a band below one lattice step leaves a
    # lead the runs cannot resolve; a band of a step (the floor when the boundary runs
    # disagreed) or more, or none measured, leaves the ranking to the runs
    assert not runs_can_rank(0.5, 1.0)
    assert not runs_can_rank(0.99, 1.0)
    assert runs_can_rank(1.0, 1.0)
    assert runs_can_rank(1.2, 1.0)
    assert runs_can_rank(None, 1.0)


def _noise(band: float) -> NoiseRecord:
    """A noise record whose band is ``band`` percent (its throughput spread)."""
    runs = [NoiseRun(True, 100.0 + d * band / 2, 1.0, 1.0, 1.0) for d in (-1, 1)]
    return band_of(0, 1.0, runs, 1.0)


def test_a_block_of_runs_shares_one_worker_that_takes_each_runs_seed(tmp_path: Path) -> None:
    # docs/tuning.md#7-validation, "One worker for a block of runs": the order reverses from
    # one repeat to the next (0 3, 3 0, 0 3, 3 0), so a config's run that ends one repeat and
    # the one that opens the next share a worker, which takes the new run's seed; the figures
    # are exactly those of a worker started for each run
    spec = {0: (1.0, 0.05), 3: (1.3, 0.05)}
    cfg = _cfg(validate={"top_k": 1, "repeats": 4})
    caps = {}
    for kind, runner in (("fresh", NoisyRunner), ("kept", KeepableNoisyRunner)):
        log: list[Any] = []
        with Store.open(f"sqlite:///{tmp_path / f'{kind}.db'}") as store:
            _study(store, cfg, {0: 100.0, 3: 130.0})
            _validate(store, cfg, spec, log=log, runner=runner)
            runs = store.repeats("t")
        caps[kind] = {(r.repeat_index, r.trial_number): r.capacity_scale for r in runs}
        starts = [e[1] for e in log if e[0] == "start"]
        stops = [e for e in log if e[0] == "stop"]
        if kind == "fresh":
            assert starts == [0, 3, 3, 0, 0, 3, 3, 0]
        else:
            assert starts == [0, 3, 0, 3, 0]
            assert [e[1] for e in log if e[0] == "reseed"] == [3, 0, 3]
            seeds = {r.repeat_index: r.jitter_seed for r in runs}
            assert [e[2] for e in log if e[0] == "reseed"] == [seeds[1], seeds[2], seeds[3]]
        assert len(stops) == len(starts) and log[-1][0] == "stop"  # no worker left running
    assert caps["kept"] == caps["fresh"] and len(caps["kept"]) == 8


def test_a_worker_that_died_is_not_kept_for_the_next_run(tmp_path: Path) -> None:
    spec = {0: (1.0, 0.05), 3: (1.3, 0.05)}
    cfg = _cfg(validate={"top_k": 1, "repeats": 2})
    log: list[Any] = []
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 3: 130.0})
        dying = functools.partial(KeepableNoisyRunner, dies_after=1)
        _validate(store, cfg, spec, log=log, runner=dying)
    # trial 3's run of repeat 0 saw its worker die: repeat 1's run starts a new one
    assert [e[1] for e in log if e[0] == "start"] == [0, 3, 3, 0]
    assert not [e for e in log if e[0] == "reseed"]


def test_a_run_searches_every_other_point_of_the_studys_lattice(tmp_path: Path) -> None:
    # a run's lattice (docs/tuning.md#7-validation, "A run's resolution"): the study's own
    # points, every RUN_STEPS-th from capacity_low, and the interval floored at that step
    spec = {0: (1.0, 0.05), 1: (1.3, 0.05)}
    cfg = _cfg(validate={"top_k": 1, "repeats": 4})
    low, step = cfg.strategy.capacity_low, cfg.strategy.capacity_resolution
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        _study(store, cfg, {0: 100.0, 1: 130.0})
        out = _validate(store, cfg, spec)
        runs = store.repeats("t")
    assert len(runs) == 8 and all(r.capacity_scale for r in runs)
    points = [round(math.log(r.capacity_scale / low) / math.log1p(step)) for r in runs]
    assert [r.capacity_scale for r in runs] == [low * (1 + step) ** k for k in points]
    assert all(k % 2 == 0 for k in points)
    assert len(set(points)) > 2  # the fresh samples moved the capacities
    iv = out.summary.candidate(1).interval
    assert iv.sd_used >= 100 * ((1 + step) ** 2 - 1) - 1e-9


@field("strategy.validate.stop_early")
def test_the_early_look_stops_a_settled_verdict_and_only_that(tmp_path: Path) -> None:
    # docs/tuning.md#7-validation, "Stopping early": after 3 of 5 repeats a clear gain is
    # settled (its 97.5 % interval above 0 and above the runner-up's), and so is one whose
    # runner-up measured exactly its figure on every sample (it never led), or one whose
    # runner-up beats the baseline too by a mean gain within its interval (twins: either
    # would be recommended); a gain within the noise, or a runner-up that led on a sample
    # while its own gain is not yet clear of 0, runs all 5
    cases = {
        "clear": ({0: (1.0, 0.01), 1: (1.3, 0.01), 2: (1.05, 0.01)}, 3),
        "small": ({0: (1.0, 0.03), 1: (1.02, 0.03), 2: (1.01, 0.03)}, 5),
        "close": ({0: (1.0, 0.01), 1: (1.3, 0.05), 2: (1.29, 0.05)}, 5),
        "tied": ({0: (1.0, 0.01), 1: (1.3, 0.0), 2: (1.3, 0.0)}, 3),
        "twins": ({0: (1.0, 0.01), 1: (1.3, 0.03), 2: (1.3, 0.03)}, 3),
    }
    for name, (spec, repeats) in cases.items():
        for early in (True, False):
            cfg = _cfg(validate={"top_k": 2, "repeats": 5, "stop_early": early})
            # nothing is cut for over-length: 300 requests so far bound the rate below 1.3 %
            cfg = cfg.model_copy(
                update={"slo": cfg.slo.model_copy(update={"max_overlength_rate": 0.02})}
            )
            log: list[Any] = []
            events: list[Any] = []
            with Store.open(f"sqlite:///{tmp_path / f'{name}{early}.db'}") as store:
                _study(store, cfg, {0: 100.0, 1: 130.0, 2: 120.0})
                out = _validate(store, cfg, spec, log=log, on_event=events.append)
                runs = store.repeats("t")
            want = repeats if early else 5
            assert {r.repeat_index for r in runs} == set(range(want)), name
            assert all(r.state == "COMPLETE" for r in runs) and out.runs == 3 * want
            s = out.summary
            assert s.complete and s.repeats == want
            settled = [e for e in events if type(e).__name__ == "ValidationSettledEarly"]
            assert len(settled) == (want < 5)
            if name == "clear":
                assert (s.verdict, s.chosen) == ("recommend", 1)
                assert s.candidate(1).interval.n == want
                if early:
                    assert (settled[0].repeats, settled[0].planned, settled[0].dropped) == (3, 5, 6)
                    assert settled[0].passed == ()
            if name == "close" and early:
                # at the look the runner-up's own 97.5 % interval still reached below 0
                assert min(s.candidate(n).interval.low for n in (1, 2)) > 0  # clear at 5
            if name == "twins" and early:
                other = 3 - (settled[0].chosen or 0)
                assert (settled[0].passed, settled[0].tied) == ((), (other,))
                assert s.chosen == settled[0].chosen
            if name == "tied" and early:
                assert (s.chosen, settled[0].chosen, settled[0].passed) == (1, 1, (2,))
                lows = [s.candidate(n).interval for n in (1, 2)]
                assert lows[1].high >= lows[0].low  # its interval alone would not settle it
            starts = [e for e in log if e[0] == "start"]
            assert len(starts) == 3 * want  # no run of a dropped repeat started
            assert len([e for e in log if e[0] == "stop"]) == len(starts)  # none left running
