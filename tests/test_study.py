"""The study controller end to end on the simulator: strategies, scoring, failures,
resume, storage on SQLite and Postgres, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.databases import fresh_database
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import parse_config
from autotune.errors import ConfigError, StorageError
from autotune.report.dashboard import constraint_order
from autotune.store import Store, TrialRecord
from autotune.telemetry import KINDS
from autotune.tuning.measure.scoring import CONSTRAINT_NAMES
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import Event, LevelProgress, LevelStart
from autotune.tuning.search.space import PARAM_ORDER, suggest
from autotune.tuning.search.stages import Stage, stage_plan
from autotune.tuning.study_attrs import read_header


def planned_stages(store: Store, cfg: Any) -> list[Stage]:
    """The staged plan the study's stored trials give (tuning/search/stages.py)."""
    study = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
    bounds = read_header(study).bounds
    return stage_plan(study.get_trials(), cfg.strategy, bounds)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as s:
        yield s


@pytest.mark.config_field("strategy.name")
@pytest.mark.config_field("strategy.trials_per_stage")
@pytest.mark.config_field("strategy.joint_refinement")
def test_staged_study_baseline_first_then_one_parameter_per_stage(store: Store) -> None:
    cfg, text = config()
    create_study(cfg, text, store)
    report = run_study("t", store)
    assert report.stopped_by == "plan complete"
    trials = store.trials("t")
    stages = [t.stage for t in trials]
    # baseline, then the fixed order with the budgets the baseline decided (a categorical
    # stage tries each candidate but the baseline's at most once; the memory stage may get
    # none), the joint refinement, then coordinate passes filling the trial budget
    plan = planned_stages(store, cfg)
    study = optuna.load_study(study_name="t", storage=store.optuna_storage())
    assert [s.name for s in plan][:5] == [*PARAM_ORDER, "joint"]
    assert all(s.budget <= cfg.strategy.trials_per_stage for s in plan[:4])
    assert all(s.name.endswith((".2", ".3", ".4", ".5")) for s in plan[5:])
    assert sum(s.budget for s in plan) == cfg.strategy.n_trials - 1
    assert stages == ["baseline", *[s.name for s in plan for _ in range(s.budget)]]
    base = trials[0]
    # vLLM's server defaults for an A100 (docs/vllm.md#11-batch-defaults-per-gpu-class),
    # max_model_len from the workload
    assert base.engine_args["max_num_seqs"] == 256
    assert base.engine_args["max_num_batched_tokens"] == 2048
    assert base.engine_args["gpu_memory_utilization"] == 0.9
    for p in PARAM_ORDER:
        stage = [t for t in trials if t.stage == p]
        others = [k for k in PARAM_ORDER if k != p]
        # within a stage only that parameter's ENGINE value moves (the token budget too:
        # the sampler's parameter is the engine value, not a fraction of a moving range)
        assert all(s.engine_args[k] == stage[0].engine_args[k] for s in stage for k in others)
    for t in trials:
        if t.inferred_from is not None:
            # a move of max_num_seqs where it never bound: its levels are the measured
            # twin's, and no worker started (docs/tuning.md#14-settling-losing-trials)
            twin = next(x for x in trials if x.optuna_trial_number == t.inferred_from)
            assert twin.inferred_from is None and twin.launch_command and not t.launch_command
            assert t.state == twin.state and t.objective == twin.objective
            continue
        # settled trials are measured too (docs/tuning.md#14-settling-losing-trials)
        assert t.state in ("COMPLETE", "PRUNED") and t.launch_command and t.levels
        # every level carries its telemetry and the seed guide's diagnosis
        # (docs/method.md#3-reading-the-bottleneck)
        for lv in t.levels:
            assert lv.telemetry is not None and lv.diagnosis is not None
            assert lv.diagnosis["kind"] in KINDS and lv.diagnosis["suggestion"]
        assert t.diagnosis is not None
        assert t.launch_command.startswith(
            "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len "
        )
        assert len(t.constraints) == 4
        ea = t.engine_args
        assert ea["max_num_batched_tokens"] >= ea["max_num_seqs"]
    # Optuna saw the same trials, with constraints and our attributes
    assert len(study.trials) == len(trials)
    assert all(len(ft.constraints) == 4 for ft in study.trials)
    assert study.trials[0].user_attrs["stage"] == "baseline"


@pytest.mark.config_field("enqueue")
def test_worker_failure_is_a_complete_infeasible_trial(store: Store) -> None:
    cfg, text = config(enqueue=[{"gpu_memory_utilization": 0.19}], strategy={"n_trials": 2})
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    failed = trials[1]
    assert failed.stage == "enqueue-0" and failed.state == "COMPLETE"
    assert failed.failure_class == "NO_KV_MEMORY"
    assert failed.objective == 0 and failed.feasible is False
    assert all(c > 0 for c in failed.constraints)
    assert "No available memory for the cache blocks" in (failed.log_tail or "")
    ft = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials[1]
    assert ft.state == optuna.trial.TrialState.COMPLETE and ft.value == 0
    assert all(v > 0 for v in ft.constraints.values())
    assert ft.user_attrs["failure_class"] == "NO_KV_MEMORY"


@pytest.mark.config_field("telemetry.preemption_constraint")
def test_preemptions_can_be_a_constraint(store: Store) -> None:
    # a tiny KV cache (kv_cache_memory_bytes) and long outputs force preemptions
    cfg, text = config(
        telemetry={"preemption_constraint": True},
        mode="fixed-rate",
        worker={"static_args": {"kv_cache_memory_bytes": 800 * 2**20}},
        workload={"output_len": 600, "rate": 20},
        strategy={"name": "joint", "n_trials": 2},
    )
    create_study(cfg, text, store)
    run_study("t", store)
    t = store.trials("t")[0]
    assert t.levels[0].metrics["num_preemptions"] > 0
    assert t.diagnosis is not None and t.diagnosis["kind"] == "memory-bound"
    ft = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials[0]
    # Optuna holds the constraints as the list optuna-dashboard reads, in name order
    names = constraint_order([*CONSTRAINT_NAMES, "preemptions"])
    assert ft.constraints[str(names.index("preemptions"))] == 1.0 and t.feasible is False
    assert ft.user_attrs["diagnosis"] == "memory-bound"


def test_joint_strategy_suggests_valid_configs(store: Store) -> None:
    cfg, text = config(strategy={"name": "joint", "n_trials": 7})
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    assert [t.stage for t in trials] == ["baseline"] + ["joint"] * 6
    assert len({json.dumps(t.engine_args, sort_keys=True) for t in trials}) == 7


def test_run_resumes_and_interrupted_trials_fail_cleanly(store: Store) -> None:
    cfg, text = config(strategy={"n_trials": 7, "trials_per_stage": 1, "joint_refinement": 0})
    create_study(cfg, text, store)
    assert run_study("t", store, n_trials=2).trials_run == 2

    def interrupt(e: Event) -> None:
        if isinstance(e, LevelStart):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study("t", store, on_event=interrupt)
    states = [t.state for t in store.trials("t")]
    assert states == ["COMPLETE", "COMPLETE", "FAIL"]
    report = run_study("t", store)
    assert report.stopped_by == "plan complete"
    trials = store.trials("t")
    plan = planned_stages(store, cfg)
    expected = ["baseline", *[s.name for s in plan for _ in range(s.budget)]]
    assert [t.stage for t in trials if t.state == "COMPLETE"] == expected
    ft = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials
    assert ft[2].state == optuna.trial.TrialState.FAIL


@pytest.mark.config_field("mode")
@pytest.mark.config_field("workload.concurrency")
@pytest.mark.config_field("search.extra.name")
@pytest.mark.config_field("search.extra.choices")
def test_offline_mode_closed_loop_with_extra_parameter(store: Store) -> None:
    cfg, text = config(
        mode="offline",
        slo={"p99_ttft_ms": None, "p99_tpot_ms": None},
        workload={"arrival": "closed", "concurrency": 32, "rate": None},
        search={"extra": [{"name": "enable_chunked_prefill", "choices": [True, False]}]},
        strategy={"name": "joint", "n_trials": 4},
    )
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    assert all(len(t.levels) == 1 for t in trials if t.failure_class is None)
    for t in trials[1:]:
        assert "enable_chunked_prefill" in t.engine_args
        if not t.engine_args["enable_chunked_prefill"]:
            assert t.engine_args["max_num_batched_tokens"] >= t.engine_args["max_model_len"]


def test_bad_inputs_name_the_field_and_keep_the_store(store: Store) -> None:
    cfg, text = config(enqueue=[{"max_num_seqz": 4}])
    with pytest.raises(ConfigError, match=r"enqueue\[0\]\.max_num_seqz"):
        create_study(cfg, text, store)
    with pytest.raises(ConfigError, match=r"test.yaml:\d+: slo.p99_ttft_ms"):
        parse_config(text.replace("p99_ttft_ms: 3000", "p99_ttft_ms: -1"), "test.yaml")
    cfg, text = config()
    create_study(cfg, text, store)
    with pytest.raises(StorageError, match="already exists"):
        create_study(cfg, text, store)
    assert store.get_study("t") is not None


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_cli_end_to_end(backend: str, tmp_path: Path) -> None:
    cfg_path = tmp_path / "study.yaml"
    # a 5 % over-length limit: the baseline's max_model_len is the longest of the study's
    # 120 prompts, and it cuts about 1.8 % of the validation samples' requests; under the
    # default 1 % no config meets the limit and `study best` recommends nothing (exit 4,
    # docs/tuning.md#7-validation)
    _, text = config(strategy={"name": "joint", "n_trials": 3}, slo={"max_overlength_rate": 0.05})
    cfg_path.write_text(text)
    runner = CliRunner()
    with fresh_database(backend, tmp_path) as url:
        if backend == "postgres":  # Postgres is never upgraded behind the user's back
            r = runner.invoke(app, ["study", "list", "--storage", url])
            assert r.exit_code == 1 and "autotune db upgrade" in str(r.exception)
        up = runner.invoke(app, ["db", "upgrade", "--storage", url])
        assert up.exit_code == 0 and "at revision" in up.output
        r = runner.invoke(
            app, ["study", "create", "--config", str(cfg_path), "--storage", url, "--run"]
        )
        assert r.exit_code == 0, r.output
        assert "3 trial(s) run" in r.output
        # the plan, printed at create: strategy joint, 3 trials, baseline first
        assert "plan: strategy joint: 3 trials, baseline first" in r.output
        best = runner.invoke(app, ["study", "best", "t", "--storage", url])
        # configs that tie the baseline (all at the top of the range) are too noisy to tell:
        # no command, exit 4 (docs/tuning.md#7-validation)
        noisy = "too noisy to tell on this server" in best.output
        assert best.exit_code == (4 if noisy else 0), best.output
        first = best.output.splitlines()[0]
        assert noisy or first.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-")
        # the validation phase ran: an interval, with the gain or the advice to keep
        assert "(95 % CI " in best.output, best.output
        assert "gain over baseline" in best.output or "keep your current config" in best.output
        show = runner.invoke(app, ["study", "show", "t", "--storage", url])
        assert show.exit_code == 0 and "baseline" in show.output and "plan: " in show.output
        shown = json.loads(
            runner.invoke(app, ["study", "show", "t", "--json", "--storage", url]).output
        )
        plan, price = shown["plan"]
        assert plan == "strategy joint: 3 trials, baseline first"
        assert price.startswith("about ") and " GPU-hours (3 trials of about " in price
        # what the workers cost, counted (docs/cost.md): every trial and validation run
        cost = shown["cost"]
        assert cost["worker_starts"] == 3 + cost["validation_starts"] and cost["gpu_s"] > 0
        # runs of one config in a row share a worker (docs/tuning.md#7-validation)
        assert 0 < cost["validation_starts"] < cost["validation_runs"]
        assert cost["startup_modelled"] is True and "cost: " in show.output
        exp = runner.invoke(app, ["study", "export", "t", "--format", "json", "--storage", url])
        body = json.loads(exp.output)
        assert body["study"]["name"] == "t" and len(body["trials"]) == 3
        assert body["cost"] == cost
        assert all(t["worker_s"] > 0 and t["cost_modelled"] for t in body["trials"])
        t0 = body["trials"][0]
        assert {"params", "state", "failure_class", "objective", "constraints", "levels"} <= set(t0)
        assert "p99_ttft_ms" in t0["levels"][0] and "metrics" not in t0["levels"][0]
        exp = runner.invoke(app, ["study", "export", "t", "--full", "--storage", url])
        assert "p99_ttft_ms" in json.loads(exp.output)["trials"][0]["levels"][0]["metrics"]
        csv_out = runner.invoke(
            app, ["study", "export", "t", "--format", "csv", "--storage", url]
        ).output
        assert csv_out.splitlines()[0].startswith("trial,stage,state,max_model_len")
        lst = runner.invoke(app, ["study", "list", "--storage", url])
        assert "t" in lst.output
        assert (
            runner.invoke(app, ["study", "delete", "t", "--storage", url, "--yes"]).exit_code == 0
        )
        with Store.open(url) as store:
            assert store.get_study("t") is None


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nmodel: {name: meta-llama/Llama-3.1-8B-Instruct}\n"
        "hardware: H100-80GB\nworkload:\n  source: synthetic\n  rate: 0\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "study",
            "create",
            "--config",
            str(bad),
            "--storage",
            f"sqlite:///{tmp_path / 'x.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "bad.yaml:6: workload.rate" in lines[0]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "study",
            "best",
            "nope",
            "--storage",
            f"sqlite:///{tmp_path / 'x.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 4 and "no study named 'nope'" in proc.stderr


@pytest.mark.config_field("worker.kind")
@pytest.mark.config_field("workload.warmup")
def test_sim_worker_study_runs_the_full_process_path(store: Store, tmp_path: Path) -> None:
    """worker: sim launches `autotune sim serve` per trial through the same supervisor and
    argv builder as vLLM, and replays the load over HTTP (after the warm-up requests)."""
    cfg, text = config(
        mode="fixed-rate",
        worker={"kind": "sim", "time_scale": 10.0, "workdir": str(tmp_path / "w")},
        # all at once: a schedule has send lag to check, and in CI a loaded two-core host sent
        # even 20 wall req/s (2 at time_scale 10) late twice, so the run stopped as
        # client-limited (docs/loadgen.md#5-client-limited-levels); this test is about the
        # process path, not the arrival process
        workload={"num_prompts": 40, "arrival": "all-at-once", "warmup": 3},
        enqueue=[{"max_num_seqs": 512, "max_num_batched_tokens": 256}],
        # the process path, not level length: the 40-request sample as it is (looped to the
        # default 30 engine s every level would be two copies, 4 wall s;
        # docs/tuning.md#13-level-length)
        strategy={"name": "joint", "n_trials": 3, "min_level_s": 0, "min_level_requests": 0},
    )
    create_study(cfg, text, store)
    events: list[Event] = []
    run_study("t", store, on_event=events.append)
    trials = store.trials("t")
    assert len(trials) == 3
    # live replay progress reaches the caller while a level runs
    live = [e for e in events if isinstance(e, LevelProgress)]
    assert live and live[-1].planned == 40 and live[-1].sent <= 40
    ok, bad = trials[0], trials[1]
    assert ok.failure_class is None and ok.levels[0].completed == 40
    assert ok.levels[0].metrics["warmup_requests"] == 3  # sent first, not measured
    assert ok.launch_argv is not None and ok.launch_argv[1:5] == [
        "-m",
        "autotune.cli",
        "sim",
        "serve",
    ]
    assert ok.kv_cache_tokens and ok.kv_cache_tokens > 0 and ok.startup_s is not None
    # vLLM validates mnbt >= mns at startup: the enqueued config fails like vLLM would
    assert bad.failure_class == "MNBT_LT_MNS" and bad.objective == 0
    assert "must be greater than or equal to max_num_seqs" in (bad.log_tail or "")


@pytest.mark.postgres
def test_two_controllers_share_one_study_on_postgres(tmp_path: Path) -> None:
    """Scale-out through Optuna's RDB storage: two `study run` processes on one study."""
    _, text = config(strategy={"name": "joint", "n_trials": 20})
    cfg_path = tmp_path / "s.yaml"
    cfg_path.write_text(text)
    with fresh_database("postgres", tmp_path) as url:
        Store.open(url, upgrade=True).close()
        runner = CliRunner()
        r = runner.invoke(app, ["study", "create", "--config", str(cfg_path), "--storage", url])
        assert r.exit_code == 0, r.output
        cmd = [
            sys.executable,
            "-m",
            "autotune.cli",
            "study",
            "run",
            "t",
            "--n-trials",
            "3",
            "--storage",
            url,
        ]
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=240) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        with Store.open(url) as store:
            trials = store.trials("t")
            study = optuna.load_study(study_name="t", storage=store.optuna_storage())
            states = [t.state for t in study.trials]
        assert len(trials) == 6 and all(t.state in ("COMPLETE", "PRUNED") for t in trials)
        assert sorted(t.optuna_trial_number for t in trials) == list(range(6))
        assert [t.stage for t in trials].count("baseline") == 1  # popped by exactly one
        measured = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        assert sum(s in measured for s in states) == 6


def test_a_trial_a_killed_run_left_running_is_failed_and_retried_at_the_next_start(
    store: Store,
) -> None:
    """A RUNNING trial nobody holds a claim on (as a controller killed mid-trial by an
    older autotune, which claimed nothing, leaves it) is failed in both stores when the next
    run starts, and its configuration runs again, once (docs/faults.md)."""
    cfg, text = config(strategy={"name": "joint", "n_trials": 3})
    create_study(cfg, text, store)
    run_study("t", store, n_trials=1)
    study = optuna.load_study(study_name="t", storage=store.optuna_storage())
    orphan = study.ask()  # as if a controller was killed mid-trial
    suggest(orphan, read_header(study).bounds)
    orphan.set_user_attr("stage", "joint")
    store.add_trial(
        TrialRecord(
            study_name="t",
            optuna_trial_number=orphan.number,
            stage="joint",
            state="RUNNING",
            params={},
            engine_args={},
            launch_command=None,
            launch_argv=None,
            worker_kind="sim-virtual",
        )
    )
    report = run_study("t", store, n_trials=0)
    assert any(f"trial {orphan.number} (joint) failed" in line for line in report.recovered)
    assert store.trials("t")[1].state == "FAIL"
    trials = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials
    assert trials[1].state == optuna.trial.TrialState.FAIL
    retry = trials[2]
    assert retry.state == optuna.trial.TrialState.WAITING
    assert retry.system_attrs["retry_history"] == [orphan.number]
    # the failed configuration exactly, as enqueued trials carry theirs
    assert retry.system_attrs["fixed_params"] == trials[1].params
    assert retry.user_attrs["stage"] == "joint"
    run_study("t", store)
    rows = store.trials("t")
    # measured in full or settled (docs/tuning.md#14-settling-losing-trials)
    assert [r.state for r in rows][:2] == ["COMPLETE", "FAIL"] and len(rows) == 4
    assert all(r.state in ("COMPLETE", "PRUNED") for r in rows[2:])
    assert rows[2].stage == "joint" and rows[2].params == trials[1].params
