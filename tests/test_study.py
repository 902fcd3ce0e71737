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
import yaml
from test_store import fresh_database
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.store import Store, TrialRecord
from autotune.telemetry import KINDS
from autotune.tuning.controller import create_study, run_study
from autotune.tuning.space import PARAM_ORDER

BASE: dict[str, Any] = {
    "name": "t",
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "hardware": "A100-80GB",
    "worker": {"kind": "sim-virtual"},
    "workload": {"source": "synthetic", "num_prompts": 120, "input_len": 512,
                 "output_len": 128, "arrival": "poisson", "rate": 4, "seed": 0},
    "slo": {"p99_ttft_ms": 3000, "p99_tpot_ms": 45},
    "mode": "slo-capacity",
    "strategy": {"name": "staged", "trials_per_stage": 2, "joint_refinement": 1,
                 "n_trials": 30, "capacity_levels": 4},
}


def config(**over: Any) -> tuple[Any, str]:
    d = json.loads(json.dumps(BASE))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    text = yaml.safe_dump(d)
    return parse_config(text, "test.yaml"), text


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as s:
        yield s


def test_staged_study_baseline_first_then_one_parameter_per_stage(store: Store) -> None:
    cfg, text = config()
    create_study(cfg, text, store)
    report = run_study("t", store)
    assert report.stopped_by == "plan complete"
    trials = store.trials("t")
    stages = [t.stage for t in trials]
    study = optuna.load_study(study_name="t", storage=store.url)
    cands = json.loads(study.user_attrs["autotune.bounds"])["max_model_len_candidates"]
    # baseline, then the fixed order (a categorical stage tries each candidate at most
    # once), then the joint refinement
    per_stage = {p: 2 for p in PARAM_ORDER} | {"max_model_len": min(2, len(cands))}
    assert stages == ["baseline", *[p for p in PARAM_ORDER for _ in range(per_stage[p])],
                      "joint"]
    base = trials[0]
    # vLLM's server defaults for an A100 (vllm.md §1.1), max_model_len from the workload
    assert base.engine_args["max_num_seqs"] == 256
    assert base.engine_args["max_num_batched_tokens"] == 2048
    assert base.engine_args["gpu_memory_utilization"] == 0.9
    for p in PARAM_ORDER:
        stage = [t for t in trials if t.stage == p]
        others = [k for k in PARAM_ORDER if k != p and k != "max_num_batched_tokens"]
        # within a stage only that parameter moves (mnbt's engine value follows mns/mml)
        assert all(s.engine_args[k] == stage[0].engine_args[k] for s in stage for k in others)
    for t in trials:
        assert t.state == "COMPLETE" and t.launch_command and t.levels
        # every level carries its telemetry and the seed guide's diagnosis
        for lv in t.levels:
            assert lv.telemetry is not None and lv.diagnosis is not None
            assert lv.diagnosis["kind"] in KINDS and lv.diagnosis["suggestion"]
        assert t.diagnosis is not None
        assert t.launch_command.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct "
                                           "--max-model-len ")
        assert len(t.constraints) == 4
        ea = t.engine_args
        assert ea["max_num_batched_tokens"] >= ea["max_num_seqs"]
    # Optuna saw the same trials, with constraints and our attributes
    assert len(study.trials) == len(trials)
    assert all(len(ft.constraints) == 4 for ft in study.trials)
    assert study.trials[0].user_attrs["stage"] == "baseline"


def test_worker_failure_is_a_complete_infeasible_trial(store: Store) -> None:
    cfg, text = config(enqueue=[{"gpu_memory_utilization": 0.19}],
                       strategy={"n_trials": 2})
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    failed = trials[1]
    assert failed.stage == "enqueue-0" and failed.state == "COMPLETE"
    assert failed.failure_class == "NO_KV_MEMORY"
    assert failed.objective == 0 and failed.feasible is False
    assert all(c > 0 for c in failed.constraints)
    assert "No available memory for the cache blocks" in (failed.log_tail or "")
    ft = optuna.load_study(study_name="t", storage=store.url).trials[1]
    assert ft.state == optuna.trial.TrialState.COMPLETE and ft.value == 0
    assert all(v > 0 for v in ft.constraints.values())
    assert ft.user_attrs["failure_class"] == "NO_KV_MEMORY"


def test_preemptions_can_be_a_constraint(store: Store) -> None:
    # a tiny KV cache (kv_cache_memory_bytes) and long outputs force preemptions
    cfg, text = config(telemetry={"preemption_constraint": True}, mode="fixed-rate",
                       worker={"static_args": {"kv_cache_memory_bytes": 800 * 2**20}},
                       workload={"output_len": 600, "rate": 20},
                       strategy={"name": "joint", "n_trials": 2})
    create_study(cfg, text, store)
    run_study("t", store)
    t = store.trials("t")[0]
    assert t.levels[0].metrics["num_preemptions"] > 0
    assert t.diagnosis is not None and t.diagnosis["kind"] == "memory-bound"
    ft = optuna.load_study(study_name="t", storage=store.url).trials[0]
    assert ft.constraints["preemptions"] == 1.0 and t.feasible is False
    assert ft.user_attrs["diagnosis"] == "memory-bound"


def test_joint_strategy_suggests_valid_configs(store: Store) -> None:
    cfg, text = config(strategy={"name": "joint", "n_trials": 7})
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    assert [t.stage for t in trials] == ["baseline"] + ["joint"] * 6
    assert len({json.dumps(t.engine_args, sort_keys=True) for t in trials}) == 7


def test_run_resumes_and_interrupted_trials_fail_cleanly(store: Store) -> None:
    cfg, text = config(strategy={"n_trials": 30, "trials_per_stage": 1, "joint_refinement": 0})
    create_study(cfg, text, store)
    assert run_study("t", store, n_trials=2).trials_run == 2

    def interrupt(kind: str, d: Any) -> None:
        if kind == "level_start":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study("t", store, on_event=interrupt)
    states = [t.state for t in store.trials("t")]
    assert states == ["COMPLETE", "COMPLETE", "FAIL"]
    report = run_study("t", store)
    assert report.stopped_by == "plan complete"
    trials = store.trials("t")
    assert [t.stage for t in trials if t.state == "COMPLETE"] == ["baseline", *PARAM_ORDER]
    ft = optuna.load_study(study_name="t", storage=store.url).trials
    assert ft[2].state == optuna.trial.TrialState.FAIL


def test_offline_mode_closed_loop_with_extra_parameter(store: Store) -> None:
    cfg, text = config(mode="offline", slo={"p99_ttft_ms": None, "p99_tpot_ms": None},
                       workload={"arrival": "closed", "concurrency": 32, "rate": None},
                       search={"extra": [{"name": "enable_chunked_prefill",
                                          "choices": [True, False]}]},
                       strategy={"name": "joint", "n_trials": 4})
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
    with pytest.raises(Exception, match="already exists"):
        create_study(cfg, text, store)
    assert store.get_study("t") is not None


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres",
                                                            marks=pytest.mark.postgres)])
def test_cli_end_to_end(backend: str, tmp_path: Path) -> None:
    cfg_path = tmp_path / "study.yaml"
    _, text = config(strategy={"name": "joint", "n_trials": 3})
    cfg_path.write_text(text)
    runner = CliRunner()
    with fresh_database(backend, tmp_path) as url:
        if backend == "postgres":  # Postgres is never upgraded behind the user's back
            r = runner.invoke(app, ["study", "list", "--storage", url])
            assert r.exit_code == 1 and "autotune db upgrade" in str(r.exception)
        up = runner.invoke(app, ["db", "upgrade", "--storage", url])
        assert up.exit_code == 0 and "at revision" in up.output
        r = runner.invoke(app, ["study", "create", "--config", str(cfg_path), "--storage", url,
                                "--run"])
        assert r.exit_code == 0, r.output
        assert "3 trial(s) run" in r.output
        best = runner.invoke(app, ["study", "best", "t", "--storage", url])
        assert best.exit_code == 0
        first = best.output.splitlines()[0]
        assert first.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len")
        assert "gain over baseline" in best.output
        show = runner.invoke(app, ["study", "show", "t", "--storage", url])
        assert show.exit_code == 0 and "baseline" in show.output
        exp = runner.invoke(app, ["study", "export", "t", "--format", "json", "--storage", url])
        body = json.loads(exp.output)
        assert body["study"]["name"] == "t" and len(body["trials"]) == 3
        t0 = body["trials"][0]
        assert {"params", "state", "failure_class", "objective", "constraints",
                "levels"} <= set(t0)
        assert "p99_ttft_ms" in t0["levels"][0]["metrics"]
        csv_out = runner.invoke(app, ["study", "export", "t", "--format", "csv",
                                      "--storage", url]).output
        assert csv_out.splitlines()[0].startswith("trial,stage,state,max_model_len")
        lst = runner.invoke(app, ["study", "list", "--storage", url])
        assert "t" in lst.output
        assert runner.invoke(app, ["study", "delete", "t", "--storage", url]).exit_code == 0
        assert Store.open(url).get_study("t") is None


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {name: meta-llama/Llama-3.1-8B-Instruct}\n"
                   "hardware: H100-80GB\nworkload:\n  source: synthetic\n  rate: 0\n")
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "study", "create", "--config",
                           str(bad), "--storage", f"sqlite:///{tmp_path / 'x.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "bad.yaml:6: workload.rate" in lines[0]
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "study", "best", "nope",
                           "--storage", f"sqlite:///{tmp_path / 'x.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no study named 'nope'" in proc.stderr


def test_sim_worker_study_runs_the_full_process_path(store: Store, tmp_path: Path) -> None:
    """worker: sim launches `autotune sim serve` per trial through the same supervisor and
    argv builder as vLLM, and replays the load over HTTP."""
    cfg, text = config(
        mode="fixed-rate",
        worker={"kind": "sim", "time_scale": 10.0, "workdir": str(tmp_path / "w")},
        workload={"num_prompts": 40, "rate": 8},
        enqueue=[{"max_num_seqs": 512, "max_num_batched_tokens": 256}],
        strategy={"name": "joint", "n_trials": 3})
    create_study(cfg, text, store)
    events: list[tuple[str, Any]] = []
    run_study("t", store, on_event=lambda k, d: events.append((k, d)))
    trials = store.trials("t")
    assert len(trials) == 3
    # live replay progress reaches the caller while a level runs
    live = [d for k, d in events if k == "level_progress"]
    assert live and live[-1]["planned"] == 40 and live[-1]["sent"] <= 40
    ok, bad = trials[0], trials[1]
    assert ok.failure_class is None and ok.levels[0].completed == 40
    assert ok.launch_argv is not None and ok.launch_argv[1:5] == ["-m", "autotune.cli", "sim",
                                                                  "serve"]
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
        cmd = [sys.executable, "-m", "autotune.cli", "study", "run", "t", "--n-trials", "3",
               "--storage", url]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        outs = [p.communicate(timeout=240) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        with Store.open(url) as store:
            trials = store.trials("t")
        assert len(trials) == 6 and all(t.state == "COMPLETE" for t in trials)
        assert sorted(t.optuna_trial_number for t in trials) == list(range(6))
        assert [t.stage for t in trials].count("baseline") == 1  # popped by exactly one
        study = optuna.load_study(study_name="t", storage=url)
        assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 6


def test_fail_running_marks_trials_a_killed_run_left(store: Store) -> None:
    cfg, text = config(strategy={"name": "joint", "n_trials": 3})
    create_study(cfg, text, store)
    run_study("t", store, n_trials=1)
    study = optuna.load_study(study_name="t", storage=store.url)
    orphan = study.ask()  # as if a controller was killed mid-trial
    store.add_trial(TrialRecord(study_name="t", optuna_trial_number=orphan.number,
                                stage="joint", state="RUNNING", params={}, engine_args={},
                                launch_command=None, launch_argv=None,
                                worker_kind="sim-virtual"))
    run_study("t", store, n_trials=0)  # never implicit: others may share the study
    assert store.trials("t")[1].state == "RUNNING"
    run_study("t", store, n_trials=0, reset_running=True)
    assert store.trials("t")[1].state == "FAIL"
    ft = optuna.load_study(study_name="t", storage=store.url).trials[1]
    assert ft.state == optuna.trial.TrialState.FAIL
