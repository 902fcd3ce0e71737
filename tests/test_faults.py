"""Fault injection (docs/faults.md): real ``autotune study run`` processes with ``sim``
workers on a private PostgreSQL cluster (tests/support/pgcluster.py; the shared server is never
touched), killed, terminated, interrupted and cut off from their database. Each test checks
that the study still runs exactly its plan, and adds a row to the fault ledger
(tests/support/ledger.py), printed at the end of the session:

    python -m pytest -m faults tests/test_faults.py

Heartbeats are short here (1 s, grace 10 s: on two busy cores a shorter grace would fail
live trials) and the outage tolerance is below the grace, as the config demands.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
import yaml
from support.ledger import ROWS, LedgerRow, StudyFigures, study_figures, worker_pids
from support.pgcluster import PgCluster, start_cluster
from support.services import need_service

from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.report.recommend import recommend
from autotune.store import Store
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.search.strategy import planned_total, stage_params
from autotune.tuning.study_attrs import read_header
from autotune.workers.procstat import is_alive

pytestmark = pytest.mark.faults

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONTROLLER = {"heartbeat_interval_s": 1, "grace_period_s": 10, "db_outage_tolerance_s": 6}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    got = start_cluster()
    need_service("a private PostgreSQL cluster", not isinstance(got, str), str(got))
    assert isinstance(got, PgCluster)
    try:
        yield got
        # every controller has exited and every store of this module is closed: a
        # connection still open is a leak
        with psycopg.connect(got._libpq(), autocommit=True) as conn:
            left = conn.execute(
                "SELECT datname, application_name FROM pg_stat_activity "
                "WHERE datname LIKE 'faults_%' AND pid <> pg_backend_pid()"
            ).fetchall()
        assert left == [], f"connections left open: {left}"
    finally:
        got.destroy()


def fresh_database(cluster: PgCluster) -> str:
    db = cluster.create_database(f"faults_{secrets.token_hex(4)}")
    Store.open(db, upgrade=True).close()
    return db


@pytest.fixture
def url(cluster: PgCluster) -> str:
    return fresh_database(cluster)


def sim_study(tmp: Path, name: str, **over: Any) -> dict[str, Any]:
    """A study of ``sim`` worker processes: one load level per trial, a few seconds each."""
    d: dict[str, Any] = {
        "name": name,
        "model": {"name": MODEL},
        "hardware": "A100-80GB",
        "worker": {"kind": "sim", "time_scale": 10.0, "workdir": str(tmp / "w")},
        "workload": {
            "source": "synthetic",
            "num_prompts": 40,
            "input_len": 256,
            "output_len": 64,
            "arrival": "poisson",
            # 20 wall req/s at time_scale 10: at 8 (80 wall req/s) busy cores sent late and the
            # levels were client-limited (docs/loadgen.md#5-client-limited-levels)
            "rate": 2,
            "seed": 0,
        },
        # generous: on busy cores the HTTP replay's latencies vary, and these studies are
        # about faults, not about which configuration wins
        "slo": {"p99_ttft_ms": 30000, "p99_tpot_ms": 500},
        "mode": "fixed-rate",
        "strategy": {"name": "joint", "n_trials": 2},
        "controller": CONTROLLER,
    }
    d.update(over)
    # the 40-request sample as it is, whatever strategy a test sets: looped to the default
    # 30 engine s (docs/tuning.md#13-level-length) a level would be two copies of the sample
    # (4 wall s at time_scale 10), and the controllers these tests kill would wait for it
    d["strategy"] = {"min_level_s": 0, "min_level_requests": 0, **d["strategy"]}
    return d


def create(url: str, d: dict[str, Any]) -> int:
    """Store the study; returns its planned trial count."""
    text = yaml.safe_dump(d)
    cfg = parse_config(text, "faults.yaml")
    with Store.open(url) as store:
        create_study(cfg, text, store)
        study = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
        bounds = read_header(study).bounds
    return planned_total(cfg.strategy, bounds, 1 + len(cfg.enqueue))


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored (POSIX), and
    # the child would inherit that: a suite run as `nohup bash .ci/run &` then saw the
    # controller ignore the test's Ctrl-C and finish its trial (exit 0). A user's terminal
    # delivers SIGINT to a process that handles it, so the controller gets the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def controller(
    url: str, name: str, log: Path, err: Path | None = None, debug_log: Path | None = None
) -> subprocess.Popen[bytes]:
    """``autotune study run``, stdout and stderr to ``log`` (stderr to ``err`` when given;
    autotune's debug log to ``debug_log``)."""
    extra = ["--log-file", str(debug_log)] if debug_log is not None else []
    with log.open("ab") as out, (err or log).open("ab") as errors:
        return subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", *extra, "study", "run", name, "--storage", url],
            stdout=out,
            stderr=errors if err is not None else subprocess.STDOUT,
            preexec_fn=_default_sigint,
        )


def wait_for(what: str, pred: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def worker_running(url: str, name: str, trial_name: str) -> Callable[[], bool]:
    store = Store.open(url)

    def check() -> bool:
        return any(w.trial_name == trial_name for w in store.fleet().workers(name))

    check.store = store  # type: ignore[attr-defined]  (closed by the caller)
    return check


def wait_worker(url: str, name: str, trial_name: str, timeout_s: float = 90) -> None:
    check = worker_running(url, name, trial_name)
    try:
        wait_for(f"the worker of {trial_name}", check, timeout_s)
    finally:
        check.store.close()  # type: ignore[attr-defined]


def orphans_after(pids: list[int], limit_s: float) -> int:
    """How many of ``pids`` still run ``limit_s`` seconds from now (sooner when none)."""
    deadline = time.monotonic() + limit_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if is_alive(p)]
    return len(alive)


def recover_s(url: str, name: str, fault_at: datetime) -> float | None:
    """Seconds from the fault until the study started a trial again."""
    with Store.open(url) as store:
        later = [
            r.started_at
            for r in store.trials(name, with_levels=False)
            if r.started_at is not None and r.started_at > fault_at
        ]
    return (min(later) - fault_at).total_seconds() if later else None


def stage_names(d: dict[str, Any], url: str) -> list[str]:
    with Store.open(url) as store:
        study = optuna.load_study(study_name=d["name"], storage=store.optuna_storage())
        bounds = read_header(study).bounds
    names = ["max_num_batched_tokens" if p.endswith("_frac") else p for p in stage_params(bounds)]
    return ["baseline", *names, "joint"]


def check_and_log(
    fault: str,
    fig: StudyFigures,
    *,
    orphans: int,
    recover: float | None,
    note: str = "",
    detect: float | None = None,
    clean_verdict: bool | None = None,
) -> None:
    ROWS.append(
        LedgerRow(
            fault,
            fig.lost,
            fig.duplicates,
            orphans,
            recover,
            fig.idle_s,
            fig.disagreements,
            note,
            detect_s=detect,
            clean_verdict=clean_verdict,
        )
    )
    assert (fig.complete, fig.lost, fig.duplicates, fig.disagreements) == (fig.planned, 0, 0, 0), (
        fig
    )
    assert orphans == 0


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def kill_mid_trial(cluster: PgCluster, tmp: Path, sig: signal.Signals) -> None:
    """Kill (SIGKILL) or terminate (SIGTERM) a controller while its baseline's worker runs,
    then start another: the worker is gone, the trial runs again once, the plan completes."""
    url = fresh_database(cluster)
    d = sim_study(tmp, "kill", strategy={"name": "joint", "n_trials": 1})
    planned = create(url, d)
    log = tmp / "controller.log"
    first = controller(url, "kill", log)
    wait_worker(url, "kill", "trial-0000")  # the baseline's worker is up: mid-trial
    old = worker_pids(str(tmp / "w"))
    assert old, "the worker process should be visible"
    fault_at = datetime.now(UTC)
    first.send_signal(sig)
    rc = first.wait(timeout=60)
    assert rc == (-9 if sig == signal.SIGKILL else 128 + signal.SIGTERM), _tail(log)
    if sig == signal.SIGTERM:  # stopped as Ctrl-C stops a run: failed in both stores
        with Store.open(url) as store:
            assert [r.state for r in store.trials("kill")] == ["FAIL"]
    second = controller(url, "kill", log)
    orphans = orphans_after(old, 10.0)  # within 10 s of the restart
    assert second.wait(timeout=180) == 0, _tail(log)
    fig = study_figures(url, "kill", planned, stage_names(d, url))
    assert fig.retries == 1, _tail(log)
    with Store.open(url) as store:
        rows = store.trials("kill")
        workers = store.fleet().workers("kill", states=None)
        claims = store.fleet().claims("kill")
    assert [(r.stage, r.state) for r in rows] == [("baseline", "FAIL"), ("baseline", "COMPLETE")]
    assert rows[0].engine_args == rows[1].engine_args
    # every worker group recorded and closed (the killed one's by the watchdog or the
    # reaper), every trial's temp folder removed, every claim released with its outcome
    assert [w.trial_name for w in workers] == ["trial-0000", "trial-0001"]
    assert all(w.state in ("stopped", "reaped") and w.proc_start for w in workers), workers
    assert not any(w.tmpdir and Path(w.tmpdir).exists() for w in workers), workers
    assert [(c.key, c.outcome) for c in claims] == [("trial:0", "FAIL"), ("trial:1", "COMPLETE")]
    name = "kill -9" if sig == signal.SIGKILL else "SIGTERM"
    check_and_log(
        f"{name} of the controller mid-trial, then restart",
        fig,
        orphans=orphans,
        recover=recover_s(url, "kill", fault_at),
        note="trial retried once",
    )


def ctrl_c_during_the_baseline(cluster: PgCluster, tmp: Path) -> None:
    """Ctrl-C (SIGINT) during the baseline, then resume: the baseline runs again."""
    url = fresh_database(cluster)
    d = sim_study(tmp, "ctrlc", strategy={"name": "joint", "n_trials": 1})
    planned = create(url, d)
    log = tmp / "controller.log"
    run = controller(url, "ctrlc", log)
    wait_worker(url, "ctrlc", "trial-0000")
    old = worker_pids(str(tmp / "w"))
    fault_at = datetime.now(UTC)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130, _tail(log)
    orphans = orphans_after(old, 10.0)
    with Store.open(url) as store:
        report = run_study("ctrlc", store)
        trials = store.trials("ctrlc")
        best = recommend(parse_config(yaml.safe_dump(d), "faults.yaml"), trials)
    assert report.stopped_by == "plan complete"
    assert [(t.stage, t.state) for t in trials[:2]] == [
        ("baseline", "FAIL"),
        ("baseline", "COMPLETE"),
    ]
    # a gain over the baseline can be stated (the baseline is feasible in this study)
    assert best is not None and best.baseline is not None and best.gain_pct is not None
    fig = study_figures(url, "ctrlc", planned, stage_names(d, url))
    check_and_log(
        "Ctrl-C during the baseline, then resume",
        fig,
        orphans=orphans,
        recover=recover_s(url, "ctrlc", fault_at),
        note="the baseline ran again",
    )


@pytest.mark.config_field("strategy.n_trials")
def test_four_controllers_run_exactly_the_plan_each_configuration_once_in_stage_order(
    url: str, tmp_path: Path
) -> None:
    """Four controllers share one staged study: exactly the plan, each configuration once
    (the baseline, an enqueued config, the categorical max_model_len choices), stage order
    kept, the waits counted as idle time."""
    d = sim_study(
        tmp_path,
        "four",
        worker={"kind": "sim-virtual"},
        strategy={
            "name": "staged",
            "trials_per_stage": 2,
            "joint_refinement": 0,
            "n_trials": 14,
        },
        enqueue=[{"max_num_seqs": 64}],
    )
    planned = create(url, d)
    log = tmp_path / "controllers.log"
    procs = [controller(url, "four", log) for _ in range(4)]
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0, 0, 0, 0], _tail(log)
    fig = study_figures(url, "four", planned, stage_names(d, url))
    assert fig.stage_order_kept, _tail(log)
    with Store.open(url) as store:
        runs = store.fleet().controllers("four")
    assert len(runs) == 4 and sum(c.trials_run for c in runs) == planned
    check_and_log(
        "4 controllers share one study",
        fig,
        orphans=0,
        recover=None,
        note=f"{planned} trials planned, {fig.complete} run; stage order kept",
    )


@pytest.mark.config_field("enqueue")
def test_controllers_or_workers_killed_mid_trial_leave_nothing_behind(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """Five independent studies at once (each waits mostly on its processes starting):
    SIGKILL and SIGTERM of a controller mid-trial, Ctrl-C during the baseline, SIGKILL and
    SIGSTOP of a worker mid-level."""
    jobs = {
        "SIGKILL": lambda: kill_mid_trial(cluster, tmp_path / "sigkill", signal.SIGKILL),
        "SIGTERM": lambda: kill_mid_trial(cluster, tmp_path / "sigterm", signal.SIGTERM),
        "SIGINT": lambda: ctrl_c_during_the_baseline(cluster, tmp_path / "sigint"),
        "worker SIGKILL": lambda: worker_fault_mid_level(
            cluster, tmp_path / "wkill", signal.SIGKILL
        ),
        "worker SIGSTOP": lambda: worker_fault_mid_level(
            cluster, tmp_path / "wstop", signal.SIGSTOP
        ),
    }
    for sub in ("sigkill", "sigterm", "sigint", "wkill", "wstop"):
        (tmp_path / sub).mkdir()
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    failures = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
    for name, exc in failures.items():
        raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.config_field("controller.db_outage_tolerance_s")
def test_postgres_restarts_are_ridden_out_and_a_longer_outage_stops_the_run_cleanly(
    cluster: PgCluster, url: str, tmp_path: Path
) -> None:
    # validation off: its repeats (20 per config in fixed-rate) would each start a worker
    # and outlast the resume's time limit; this test is about the outages
    d = sim_study(
        tmp_path,
        "pg",
        strategy={"name": "joint", "n_trials": 2, "validate": {"enabled": False}},
    )
    planned = create(url, d)
    log, err, debug = (tmp_path / f"controller.{x}" for x in ("log", "err", "debug"))
    run = controller(url, "pg", log, err, debug)
    wait_worker(url, "pg", "trial-0000")
    restart_at = datetime.now(UTC)
    down = cluster.restart(3.0)  # shorter than the 6 s tolerance: ridden out
    with Store.open(url) as store:
        # recovered: the controller's heartbeats land again, and it goes on to its next trial
        wait_for("a heartbeat after the restart", lambda: beat_since(store, "pg", restart_at), 30)
        back_s = (datetime.now(UTC) - restart_at).total_seconds()
    # stopped while the next trial's sim worker (a real HTTP server process) is up: the
    # trial's next write fails past the tolerance, its worker is stopped and recording that
    # fails too (the supervisor), then the claim and the controller's end
    wait_worker(url, "pg", "trial-0001")
    assert run.poll() is None, _tail(log)
    ridden = err.read_text().splitlines()
    # the restart costs no line while it lasts; one once it is over if a call of the run
    # (not only the heartbeat, which never waits) had to wait for it
    assert all("was unreachable for" in ln and "ridden out" in ln for ln in ridden), ridden
    # down until the controller gives up: longer than its tolerance wherever its next
    # database call falls
    stop_at = datetime.now(UTC)
    cluster.stop()
    rc = run.wait(timeout=90)
    stopped_s = (datetime.now(UTC) - stop_at).total_seconds()
    cluster.start()
    lines = err.read_text().splitlines()[len(ridden) :]
    assert rc == 5, lines
    # exactly one line on stderr: the error naming the database and the tolerance
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith("error: lost the study database at postgresql"), lines
    assert "longer than the outage tolerance (6 s" in lines[0], lines
    # the rest is in the debug log: the supervisor's failed record among it
    details = debug.read_text()
    assert "DEBUG autotune.workers.supervisor: recording that worker group" in details
    assert "Traceback" in details and "DatabaseLostError" in details
    with Store.open(url) as store:
        (gone,) = store.fleet().controllers("pg")
        (w1,) = [w for w in store.fleet().workers("pg") if w.trial_name == "trial-0001"]
    # nothing could be recorded: the row says running, the worker's row too (its group is
    # gone: the orphan count below)
    assert (gone.state, w1.state) == ("running", "running")
    resumed = controller(url, "pg", log)
    assert resumed.wait(timeout=180) == 0, _tail(log)
    with Store.open(url) as store:
        first, second = store.fleet().controllers("pg")
    # the next start marks the controller that stopped on the outage failed
    assert (first.id, first.state, second.state) == (gone.id, "failed", "stopped")
    assert "its process ended without recording how" in (first.note or "")
    fig = study_figures(url, "pg", planned, stage_names(d, url))
    check_and_log(
        f"Postgres restarted mid-study ({down:.0f} s unreachable)",
        fig,
        orphans=0,
        recover=back_s,
        note="ridden out: the controller went on (recovery: until its heartbeat landed)",
    )
    check_and_log(
        f"Postgres stopped {stopped_s:.0f} s (over the 6 s tolerance), then a restart",
        fig,
        orphans=orphans_after(worker_pids(str(tmp_path / "w")), 0.0),
        recover=recover_s(url, "pg", stop_at),
        note="exit 5, one line on stderr naming the database; nothing half-written; "
        "the next start marks the controller failed",
    )


def beat_since(store: Store, name: str, since: datetime) -> bool:
    try:
        return any(c.heartbeat_at > since for c in store.fleet().controllers(name))
    except Exception:  # the server is still starting
        return False


def test_an_enqueued_value_outside_the_space_is_refused_at_create(url: str, tmp_path: Path) -> None:
    d = sim_study(tmp_path, "space", enqueue=[{"max_model_len": 200000}])
    with pytest.raises(ConfigError, match=r"enqueue\[0\]\.max_model_len: 200000 is not in the"):
        create(url, d)
    with Store.open(url) as store:
        assert store.get_study("space") is None
        assert optuna.study.get_all_study_names(storage=store.optuna_storage()) == []
    ROWS.append(
        LedgerRow(
            "enqueue: max_model_len outside the candidates",
            0,
            0,
            0,
            None,
            0.0,
            0,
            "refused at create with one line; nothing stored",
        )
    )


def _sim_port(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--port") + 1])


def _served(port: int) -> float:
    """Requests the sim server has completed (its ``vllm:request_success`` counter)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("vllm:request_success_total")
    )


def worker_fault_mid_level(cluster: PgCluster, tmp: Path, sig: signal.Signals) -> None:
    """SIGKILL or SIGSTOP the baseline's worker (the sim server process) while its level
    runs: the death is not the configuration's (KILLED, HUNG), so the attempt is failed with
    its partial level and the configuration runs once more in a fresh worker, whose clean run
    is the verdict (docs/faults.md#10-worker-faults)."""
    name = sig.name.lower()
    url = fresh_database(cluster)
    # one level of 40 requests at 4/s in real time: 10 s of arrivals, so the fault lands
    # mid-level even when the polling thread is slow (at 4x, 2.5 s, a loaded CI host once
    # killed the worker only after the level, during the noise re-runs)
    d = sim_study(
        tmp,
        name,
        worker={"kind": "sim", "time_scale": 1.0, "workdir": str(tmp / "w")},
        strategy={"name": "joint", "n_trials": 1},
    )
    d["workload"]["rate"] = 4
    planned = create(url, d)
    log = tmp / "controller.log"
    run = controller(url, name, log)
    wait_worker(url, name, "trial-0000")
    (pid,) = worker_pids(str(tmp / "w"))
    port = _sim_port(pid)
    # mid-level: the smoke request and 3 of the level's requests served
    wait_for("the level to get going", lambda: _served(port) >= 4, 60, every_s=0.05)
    fault_at = time.time()
    os.kill(pid, sig)
    assert run.wait(timeout=120) == 0, _tail(log)
    orphans = orphans_after([pid], 10.0)
    fig = study_figures(url, name, planned, stage_names(d, url))
    assert fig.retries == 1, _tail(log)
    with Store.open(url) as store:
        first, retry = store.trials(name)
    cls = "KILLED" if sig == signal.SIGKILL else "HUNG"
    assert (first.stage, first.state, first.failure_class) == ("baseline", "FAIL", cls)
    assert (first.log_tail or "").startswith(f"attempt failed ({cls})"), first.log_tail
    (lvl,) = first.levels  # the attempt's partial level stays visible
    death = lvl.metrics["worker_death"]
    assert lvl.metrics["partial"] is True and death["failure_class"] == cls
    detect_s = death["detected_wall"] - fault_at
    # the verdict comes from the retry, a clean run in a fresh worker
    assert retry.engine_args == first.engine_args and retry.state == "COMPLETE"
    clean = retry.failure_class is None and not any(x.metrics.get("partial") for x in retry.levels)
    assert clean and retry.feasible is True, retry
    if sig == signal.SIGSTOP:
        assert detect_s <= 15.0, detect_s  # by its lack of progress, not probe timeouts
    check_and_log(
        f"worker {sig.name} mid-level",
        fig,
        orphans=orphans,
        recover=recover_s(url, name, datetime.fromtimestamp(fault_at, UTC)),
        detect=detect_s,
        clean_verdict=clean,
        note=f"{cls}; the attempt kept FAIL with its partial level, retried once",
    )
