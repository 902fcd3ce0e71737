"""Claims, heartbeats and recovery in one process (docs/faults.md): the stage decision with
other controllers' trials running, heartbeats from a thread while the event loop is blocked,
a silent remote controller's trial failed after the grace period and retried once, worker
groups recorded. The multi-process faults are in test_faults.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial
from sqlalchemy import update
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.store import Store, TrialRecord
from autotune.store.rows import ControllerRow
from autotune.tuning.run.claims import Done, Wait, decide, stage_order
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import Event, LevelStart
from autotune.tuning.run.recovery import claim_key
from autotune.tuning.run.stopping import Interrupted, stop_on_signals
from autotune.tuning.search.space import SpaceBounds, suggest
from autotune.tuning.study_attrs import read_header


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as s:
        yield s


def bounds_of(store: Store, name: str = "t") -> SpaceBounds:
    study = optuna.load_study(study_name=name, storage=store.optuna_storage())
    return read_header(study).bounds


def trial(stage: str, state: TrialState = TrialState.COMPLETE, **params: Any) -> Any:
    return create_trial(
        state=state,
        value=1.0 if state == TrialState.COMPLETE else None,
        user_attrs={"stage": stage},
    )


def test_the_next_stage_waits_for_the_running_trials_of_the_one_before(store: Store) -> None:
    cfg, text = config(strategy={"trials_per_stage": 2, "joint_refinement": 0, "n_trials": 30})
    create_study(cfg, text, store)
    b, st = bounds_of(store), cfg.strategy
    assert stage_order("baseline", b) < stage_order("max_model_len", b)
    assert stage_order("max_num_seqs", b) < stage_order("max_num_batched_tokens", b)
    assert stage_order("max_num_batched_tokens", b) < stage_order("joint", b)
    # the queue first
    assert decide([trial("baseline", TrialState.WAITING)], st, b) == "enqueued"
    # the baseline still runs: the first stage would start from nothing
    got = decide([trial("baseline", TrialState.RUNNING)], st, b)
    assert isinstance(got, Wait) and "baseline" in got.reason and got.running == 1
    done = [trial("baseline")]
    second = "gpu_memory_utilization"
    stage_one = [trial("max_model_len") for _ in range(min(2, len(b.max_model_len_candidates)))]
    # one of the stage's two trials runs: the other may start beside it
    running = [trial(second, TrialState.RUNNING)]
    assert decide([*done, *stage_one, *running], st, b) == second
    # both run: the stage is fully claimed, and the next one waits for it
    running.append(trial(second, TrialState.RUNNING))
    got = decide([*done, *stage_one, *running], st, b)
    assert isinstance(got, Wait) and second in got.reason and got.running == 2


def test_the_end_of_the_plan_waits_for_running_trials_then_is_done(store: Store) -> None:
    cfg, text = config(strategy={"name": "joint", "n_trials": 2})
    create_study(cfg, text, store)
    b, st = bounds_of(store), cfg.strategy
    got = decide([trial("baseline"), trial("joint", TrialState.RUNNING)], st, b)
    assert isinstance(got, Wait)  # it may still fail and need its retry
    assert isinstance(decide([trial("baseline"), trial("joint")], st, b), Done)
    # a final failure does not count: its place in the plan is run again
    assert decide([trial("baseline"), trial("joint", TrialState.FAIL)], st, b) == "joint"


@pytest.mark.config_field("controller.grace_period_s")
def test_a_silent_remote_controllers_trial_is_failed_after_the_grace_period_and_retried(
    store: Store,
) -> None:
    cfg, text = config(
        strategy={"name": "joint", "n_trials": 3},
        controller={"heartbeat_interval_s": 1, "grace_period_s": 10, "db_outage_tolerance_s": 5},
    )
    create_study(cfg, text, store)
    run_study("t", store, n_trials=1)
    fleet = store.fleet()
    far = fleet.register("t", host="far-away", pid=4242, proc_start=None, boot_id=None)
    study = optuna.load_study(study_name="t", storage=store.optuna_storage())
    theirs = study.ask()
    suggest(theirs, bounds_of(store))
    theirs.set_user_attr("stage", "joint")
    with fleet.locked("t") as lk:
        lk.add_claim(claim_key(theirs.number), controller_id=far, trial_number=theirs.number)
    store.add_trial(
        TrialRecord(
            study_name="t",
            optuna_trial_number=theirs.number,
            stage="joint",
            state="RUNNING",
            params=dict(theirs.params),
            engine_args={},
            launch_command=None,
            launch_argv=None,
            worker_kind="sim-virtual",
        )
    )

    def silent_for(seconds: float) -> None:
        with store.engine.begin() as conn:
            conn.execute(
                update(ControllerRow)
                .where(ControllerRow.id == far)
                .values(heartbeat_at=datetime.now(UTC) - timedelta(seconds=seconds))
            )

    silent_for(3)  # within the grace period: alive, its trial is left alone
    assert run_study("t", store, n_trials=0).recovered == []
    assert store.trials("t")[1].state == "RUNNING"
    shown = CliRunner().invoke(app, ["study", "status", "t", "--storage", store.url])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    # the remote controller, alive, and its running trial; this process's two runs, stopped
    assert any("far-away" in ln and "4242" in ln and "running" in ln for ln in lines), shown.output
    assert sum("stopped" in ln for ln in lines) == 2, shown.output
    assert any(ln.startswith(f"│ {theirs.number} ") and "far-away:4242" in ln for ln in lines)
    assert "claims: 2 (1 open); queued: 0; complete: 1 of 3 planned; failed: 0" in shown.output
    silent_for(11)  # past it: lost
    report = run_study("t", store, n_trials=0)
    shown = CliRunner().invoke(app, ["study", "status", "t", "--storage", store.url]).output
    assert (
        f"retry: trial {theirs.number + 1} (joint) retries trial {theirs.number}: WAITING" in shown
    )
    assert report.recovered == [
        f"trial {theirs.number} (joint) failed: its controller far-away:4242 is silent for "
        f"11 s; retried as trial {theirs.number + 1}"
    ]
    trials = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials
    assert trials[1].state == TrialState.FAIL and store.trials("t")[1].state == "FAIL"
    assert trials[2].state == TrialState.WAITING
    assert trials[2].system_attrs["fixed_params"] == trials[1].params
    assert run_study("t", store, n_trials=0).recovered == []  # retried once, not again
    assert run_study("t", store).stopped_by == "plan complete"
    states = [r.state for r in store.trials("t")]
    # the last two measured, in full or settled (docs/tuning.md#14-settling-losing-trials)
    assert states[:2] == ["COMPLETE", "FAIL"] and len(states) == 4
    assert all(s in ("COMPLETE", "PRUNED") for s in states[2:])


@pytest.mark.config_field("controller.heartbeat_interval_s")
def test_heartbeats_come_from_a_thread_while_the_event_loop_is_blocked(store: Store) -> None:
    """The in-process simulator blocks the event loop for seconds; the controller's and
    the trial's heartbeats must go on meanwhile, every heartbeat_interval_s."""
    cfg, text = config(
        strategy={"name": "joint", "n_trials": 1},
        controller={"heartbeat_interval_s": 1, "grace_period_s": 10, "db_outage_tolerance_s": 5},
    )
    create_study(cfg, text, store)
    seen: list[float] = []

    def block(e: Event) -> None:
        if isinstance(e, LevelStart) and not seen:
            (c,) = store.fleet().controllers("t")
            seen.append(c.heartbeat_age_s)
            time.sleep(2.5)  # what a long simulation does to the loop
            (c,) = store.fleet().controllers("t")
            seen.append(c.heartbeat_age_s)

    run_study("t", store, on_event=block)
    assert seen[1] < 1.6, seen  # beaten during the block, at the interval
    beats = optuna.load_study(study_name="t", storage=store.optuna_storage()).trials[0]
    assert beats.state == TrialState.COMPLETE
    (c,) = store.fleet().controllers("t")
    assert c.state == "stopped" and c.trials_run == 1


def test_the_sqlite_study_lock_excludes_another_process(store: Store, tmp_path: Path) -> None:
    """On SQLite the study lock is a file lock: a second process waits for the first."""
    cfg, text = config(strategy={"name": "joint", "n_trials": 1})
    create_study(cfg, text, store)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from autotune.store import Store\n"
            "with Store.open(sys.argv[1]) as s, s.fleet().locked('t'):\n"
            "    print('locked', flush=True)\n"
            "    time.sleep(1.5)\n",
            store.url,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    holder.stdout.close()
    t0 = time.monotonic()
    with store.fleet().locked("t"):
        waited = time.monotonic() - t0
    assert holder.wait(timeout=30) == 0
    assert waited > 1.0, waited
    assert Path(f"{tmp_path / 'a.db'}.lock").exists()


def test_a_unit_of_work_is_claimed_by_exactly_one_caller(store: Store) -> None:
    """What is no trial (a validation run of the best config) is claimed by its key."""
    cfg, text = config(strategy={"name": "joint", "n_trials": 1})
    create_study(cfg, text, store)
    fleet = store.fleet()
    a = fleet.register("t", host="a", pid=1, proc_start=None, boot_id=None)
    b = fleet.register("t", host="b", pid=2, proc_start=None, boot_id=None)
    assert fleet.claim_once("t", "validate:best", controller_id=a) is True
    assert fleet.claim_once("t", "validate:best", controller_id=b) is False
    assert fleet.claim_once("t", "validate:best", controller_id=a) is False
    (c,) = fleet.claims("t")
    assert (c.key, c.controller_id, c.trial_number) == ("validate:best", a, None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_cancel_the_run_as_ctrl_c_does(sig: signal.Signals) -> None:
    async def run() -> int | None:
        with stop_on_signals() as stop:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), sig)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return stop.signum
        return None

    assert asyncio.run(run()) == sig
    exc = Interrupted(sig)
    assert isinstance(exc, KeyboardInterrupt) and exc.exit_code == 128 + sig
    assert str(exc) == f"stopped by {sig.name}"
