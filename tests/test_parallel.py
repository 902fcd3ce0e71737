"""Parallel trials on one host (docs/parallel.md): ``study run --gpus`` splits the devices into
lanes, each lane's worker sees only its own devices, lanes really run at once, the plan's
trial count stays exact, and a stop signal fails and requeues every lane's trial once.

The devices are fake: ``sim`` workers (real processes) ignore them, and dump the environment
they received (``--sim-dump-env`` into a folder: one file per server).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from sqlalchemy import event

from autotune import cli
from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.store import Store, TrialRecord
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import Event, RunStart
from autotune.tuning.run.lanes import LanePlan, parse_devices, plan_lanes, world_size

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# three enqueued configs and the baseline: four trials the lanes can claim at once
ENQUEUE = [{"max_num_seqs": 8}, {"max_num_seqs": 16}, {"max_num_seqs": 32}]


def study(tmp: Path, name: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "model": {"name": MODEL},
        "hardware": "A100-80GB",
        "mode": "fixed-rate",
        "worker": {
            "kind": "sim",
            # four lanes' servers and clients share the host's cores: at time_scale 40 each
            # lane's 8 requests went out at 320 wall req/s, and at 4 still late on a loaded CI
            # host, so the levels were client-limited (docs/loadgen.md#5-client-limited-levels);
            # in real time a level is about 4 s
            "time_scale": 1.0,
            "workdir": str(tmp / "w"),
            "static_args": {"sim_dump_env": str(tmp / "dumps")},
        },
        "workload": {
            "source": "synthetic",
            "num_prompts": 8,
            "input_len": 256,
            "output_len": 16,
            "arrival": "poisson",
            # 2 req/s: a send-lag bound of 1 s (2 mean gaps); at 8 (250 ms) four lanes, their
            # servers and another test on a loaded two-core CI host sent late twice
            "rate": 2,
            "seed": 0,
        },
        "slo": {"p99_ttft_ms": 30000, "p99_tpot_ms": 500},
        # validation off: its runs start workers of their own (tests/test_validate.py); the
        # 8-request sample as it is: these tests are about lanes, and looped to the default
        # 30 engine s (docs/tuning.md#13-level-length) every level would last 30 wall s
        "strategy": {
            "name": "joint",
            "n_trials": 4,
            "validate": {"enabled": False},
            "min_level_s": 0,
            "min_level_requests": 0,
        },
        "enqueue": ENQUEUE,
        "controller": {"heartbeat_interval_s": 1, "grace_period_s": 10, "db_outage_tolerance_s": 6},
    }
    d.update(over)
    (tmp / "dumps").mkdir(exist_ok=True)
    return d


def write(tmp: Path, d: dict[str, Any]) -> Path:
    path = tmp / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    return path


def cli_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def dumps(tmp: Path) -> dict[int, str | None]:
    """Trial number -> the CUDA_VISIBLE_DEVICES its worker received."""
    seen: dict[int, str | None] = {}
    for f in sorted((tmp / "dumps").glob("env-*.json")):
        env = json.loads(f.read_text(encoding="utf-8"))
        number = int(Path(env["VLLM_CACHE_ROOT"]).parent.name.removeprefix("trial-"))
        assert number not in seen, f"trial {number} started two workers"
        seen[number] = env.get("CUDA_VISIBLE_DEVICES")
    return seen


def overlap(a: TrialRecord, b: TrialRecord) -> bool:
    assert a.started_at and a.finished_at and b.started_at and b.finished_at
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def most_at_once(trials: list[TrialRecord]) -> int:
    edges: list[tuple[datetime, int]] = []
    for t in trials:
        assert t.started_at and t.finished_at
        edges += [(t.started_at, 1), (t.finished_at, -1)]
    now = top = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
        now += step
        top = max(top, now)
    return top


def test_four_devices_four_lanes_each_worker_sees_only_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    cfg = write(tmp_path, study(tmp_path, "par"))
    # `study create --run` takes --gpus too
    code, out, err = cli_main(
        ["study", "create", "--config", str(cfg), "--storage", url, "--run", "--gpus", "0,1,2,3"],
        capsys,
    )
    assert code == 0, err
    assert "4 at a time on gpu 0 | 1 | 2 | 3" in out and "4 trial(s) run (plan complete" in out
    with Store.open(url) as store:
        trials = store.trials("par", with_levels=False)
        claims = store.fleet().claims("par")
        ostudy = optuna.load_study(study_name="par", storage=store.optuna_storage())
        attrs = {t.number: t.user_attrs.get("devices") for t in ostudy.trials}
    # exactly the plan: the baseline and three enqueued configs, once each (trial numbers
    # may skip: a claim retried after SQLite's lock contention re-queues its first trial)
    assert sorted(t.stage for t in trials) == ["baseline", "enqueue-0", "enqueue-1", "enqueue-2"]
    assert all(t.state == "COMPLETE" and t.failure_class is None for t in trials)
    # each worker saw exactly one device, the one recorded on its trial (both stores)
    seen = dumps(tmp_path)
    assert set(seen) == {t.optuna_trial_number for t in trials}
    for t in trials:
        assert t.devices in ("0", "1", "2", "3"), t.devices
        assert seen[t.optuna_trial_number] == t.devices == attrs[t.optuna_trial_number]
    # never shared: trials that ran at the same time had different devices
    for a in trials:
        for b in trials:
            if a is not b and overlap(a, b):
                assert a.devices != b.devices, (a.optuna_trial_number, b.optuna_trial_number)
    # and they did run at the same time: the four queued trials all at once
    assert most_at_once(trials) == 4
    # each lane kept its device: the claim's lane says which
    lane_of = {c.trial_number: c.lane for c in claims}
    assert {lane_of[t.optuna_trial_number] for t in trials} == {0, 1, 2, 3}
    for t in trials:
        assert t.devices == str(lane_of[t.optuna_trial_number])


def test_sigterm_stops_every_lane_and_requeues_each_trial_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    d = study(tmp_path, "term")
    d["worker"]["time_scale"] = 1.0  # trials that last while the signal comes
    cfg = write(tmp_path, d)
    with Store.open(url) as store:
        create_study(parse_config(cfg.read_text(), str(cfg)), cfg.read_text(), store)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    base = [sys.executable, "-m", "autotune.cli", "study"]
    log = tmp_path / "run.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*base, "run", "term", "--storage", url, "--gpus", "0,1,2,3"],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        with Store.open(url) as store:
            deadline = time.monotonic() + 60
            while len([w for w in store.fleet().workers("term") if w.state == "running"]) < 4:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            pgids = [w.pgid for w in store.fleet().workers("term")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "stopped by SIGTERM: every running trial was failed and queued again" in text
    for pgid in pgids:  # every lane's worker group is gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    with Store.open(url) as store:
        rows = store.trials("term", with_levels=False)
        claims = store.fleet().claims("term")
        ostudy = optuna.load_study(study_name="term", storage=store.optuna_storage())
    # the four running trials failed in both stores, each queued again exactly once
    ran = sorted(r.optuna_trial_number for r in rows)
    assert len(ran) == 4 and all(r.state == "FAIL" for r in rows)
    assert sorted(r.devices or "" for r in rows) == ["0", "1", "2", "3"]
    failed = {t.number for t in ostudy.trials if t.state == optuna.trial.TrialState.FAIL}
    retries = [t for t in ostudy.trials if t.system_attrs.get("retry_history")]
    assert set(ran) <= failed
    assert sorted(t.system_attrs["retry_history"][-1] for t in retries) == ran
    assert all(t.state == optuna.trial.TrialState.WAITING for t in retries)
    assert text.count("the run was stopped by SIGTERM; retried as trial") == 4
    assert all(c.released_at is not None for c in claims)


def test_two_controllers_with_lanes_share_one_study_exactly(tmp_path: Path) -> None:
    """Several hosts, each with --gpus, on one study (here: two controllers in one process,
    in-process simulator lanes): every planned trial runs once."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    d = study(tmp_path, "shared", strategy={"name": "joint", "n_trials": 5})
    d["worker"] = {"kind": "sim-virtual"}
    text = yaml.safe_dump(d)
    with Store.open(url) as store:
        create_study(parse_config(text, "shared.yaml"), text, store)

    both = threading.Barrier(2, timeout=60)

    def started(e: Event) -> None:
        if isinstance(e, RunStart):  # registered and recovered: both claim from here on
            both.wait()

    def host(_: int) -> int:
        with Store.open(url) as store:
            return run_study("shared", store, gpus="0,1", on_event=started).trials_run

    with ThreadPoolExecutor(2) as pool:
        ran = list(pool.map(host, range(2)))
    assert sum(ran) == 5
    with Store.open(url) as store:
        rows = store.trials("shared", with_levels=False)
        claims = store.fleet().claims("shared")
    # (a claim retried after SQLite's lock contention leaves its first trial number unused:
    # the next recovery pass re-queues it, docs/faults.md#5-exact-budgets-with-many-controllers)
    assert len(rows) == 5
    assert all(r.state == "COMPLETE" and r.devices in ("0", "1") for r in rows)
    assert len({c.controller_id for c in claims}) == 2 and {c.lane for c in claims} == {0, 1}
    labels = [r.stage for r in rows if r.stage != "joint"]
    assert sorted(labels) == ["baseline", "enqueue-0", "enqueue-1", "enqueue-2"]


# -- the lane plan -------------------------------------------------------------------------


def cfg_with(**worker: Any) -> Any:
    d: dict[str, Any] = {"name": "x", "model": {"name": MODEL}, "hardware": "A100-80GB"}
    d["workload"] = {"source": "synthetic", "num_prompts": 4, "arrival": "poisson", "rate": 2}
    d["mode"], d["slo"] = "fixed-rate", {"p99_ttft_ms": 1000}
    if "extra" in worker:
        d["search"] = {"extra": worker.pop("extra")}
    d["worker"] = worker
    return parse_config(yaml.safe_dump(d), "x.yaml")


def test_lanes_follow_the_devices_and_the_parallel_sizes() -> None:
    plain = cfg_with()
    assert plan_lanes("0,1,2,3", None, plain) == LanePlan((("0",), ("1",), ("2",), ("3",)), 1)
    assert plan_lanes("0,1,2,3", 2, plain).lanes == (("0", "1"), ("2", "3"))
    assert plan_lanes("GPU-a,GPU-b", None, plain).lanes == (("GPU-a",), ("GPU-b",))
    # tensor_parallel_size implies the devices per trial; so does its product with others
    tp = cfg_with(static_args={"tensor_parallel_size": 2})
    assert plan_lanes("0,1,2,3", None, tp).lanes == (("0", "1"), ("2", "3"))
    assert plan_lanes("0,1,2,3", 2, tp).per_trial == 2  # the same K given explicitly
    tp_pp = cfg_with(static_args={"tensor-parallel-size": 2, "pipeline_parallel_size": 2})
    assert plan_lanes("0,1,2,3,4,5,6,7", None, tp_pp).per_trial == 4
    # a search.extra choice: lanes fit the largest, a smaller trial sees the first devices
    ex = cfg_with(extra=[{"name": "tensor_parallel_size", "choices": [1, 2]}])
    p = plan_lanes("4,5,6,7", None, ex)
    assert p.lanes == (("4", "5"), ("6", "7"))
    assert p.devices_for(1, {"tensor_parallel_size": 1}) == "6"
    assert p.devices_for(1, {"tensor_parallel_size": 2}) == "6,7"
    assert p.devices_for(0, {}) == "4,5"  # no parallel size: every device of the lane
    assert world_size({"max_num_seqs": 8}) is None


@pytest.mark.parametrize(
    ("gpus", "k", "worker", "line"),
    [
        ("0, 1", None, {}, "--gpus: '0, 1' is not a device list"),
        ("0,,1", None, {}, "--gpus: '0,,1' is not a device list"),
        ("0,1,0", None, {}, "lists device 0 twice"),
        ("0,1,2", 2, {}, "--gpus-per-trial 2 does not divide the 3 device(s) of --gpus 0,1,2"),
        (
            "0,1,2,3",
            1,
            {"static_args": {"tensor_parallel_size": 2}},
            "--gpus-per-trial 1 conflicts with worker.static_args.tensor_parallel_size 2: "
            "a trial needs 2 device(s)",
        ),
        (
            "0,1,2,3",
            None,
            {"static_args": {"tensor_parallel_size": 8}},
            "worker.static_args.tensor_parallel_size 8, 8 device(s), does not divide the 4",
        ),
        ("0,1", 0, {}, "--gpus-per-trial: 0 is not a positive number"),
    ],
)
def test_lane_plans_that_cannot_be_are_one_line(
    gpus: str, k: int | None, worker: dict[str, Any], line: str
) -> None:
    with pytest.raises(ConfigError) as err:
        plan_lanes(gpus, k, cfg_with(**worker))
    assert line in str(err.value) and "\n" not in str(err.value)


def test_a_claim_takes_sqlites_write_lock_at_its_start(tmp_path: Path) -> None:
    """Lanes of one process write to one SQLite file at once: the claim row's transaction
    begins IMMEDIATE, so it waits for the lock rather than being refused half-way (its
    asked trial would be left without a claim)."""
    text = yaml.safe_dump({**study(tmp_path, "lk"), "worker": {"kind": "sim-virtual"}})
    with Store.open(f"sqlite:///{tmp_path / 'l.db'}") as store:
        create_study(parse_config(text, "lk.yaml"), text, store)
        begins: list[str] = []
        event.listen(
            store.engine,
            "before_cursor_execute",
            lambda _c, _cur, stmt, *_a: begins.append(stmt) if stmt.startswith("BEGIN") else None,
        )
        with store.fleet().locked("lk") as lk:
            lk.add_claim("unit:1", controller_id=None)
            lk.claims()
    assert begins == ["BEGIN IMMEDIATE", "BEGIN"]


def test_device_lists() -> None:
    assert parse_devices("3") == ("3",)
    assert parse_devices("MIG-1-2,MIG-3") == ("MIG-1-2", "MIG-3")
    for bad in ("", ",", "0;1", "0 1"):
        with pytest.raises(ValueError, match="is not a device list"):
            parse_devices(bad)
