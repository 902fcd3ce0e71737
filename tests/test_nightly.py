"""``autotune nightly`` on sim-virtual (docs/nightly.md): the issue's scenarios, each from
the same first night (one module-scoped run, its database copied per test).

- the workload did not change: keep, exit 0 (``--skip-if-no-drift``: no study);
- prompts got 2x longer: the incumbent's max_model_len cuts too many requests, so the
  best validated feasible challenger is promoted (exit 3, "incumbent infeasible") and its
  max_model_len fits today's traffic;
- the challenger is better only within noise: keep;
- dry run: the decision is recorded, no output file is written;
- two overlapping runs: the second exits at once with one clear line (exit 6).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from support.nightly import write_config, write_trace

from autotune import cli
from autotune.nightly.drift import TrafficProfile
from autotune.nightly.job import rollback, run_nightly
from autotune.nightly.job_config import load_nightly_config
from autotune.nightly.job_records import decisions
from autotune.store import Store

DAY1 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
DAY2 = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def first_night(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose database holds the first night's decision (day-1 traffic)."""
    root = tmp_path_factory.mktemp("night1")
    write_trace(root / "traces" / "day1.jsonl", prompt=700, seed=1, mtime=1_000_000)
    cfg = load_nightly_config(write_config(root))
    with Store.open(f"sqlite:///{root / 'n.db'}") as store:
        res = run_nightly(cfg, store, now=lambda: DAY1)
    assert res.drift is not None and res.drift.first_run
    assert res.decision.study_name == "chat-20261201"
    assert res.decision.incumbent["max_model_len"] == 3072  # the config's incumbent
    return root


@pytest.fixture
def night(first_night: Path, tmp_path: Path) -> Path:
    shutil.copytree(first_night, tmp_path / "n", dirs_exist_ok=True)
    return tmp_path / "n"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def store_of(root: Path) -> Store:
    return Store.open(f"sqlite:///{root / 'n.db'}")


def test_unchanged_workload_keeps_exit_0(night: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trace(night / "traces" / "day2.jsonl", prompt=700, seed=2, mtime=2_000_000)
    code, out, err = run_cli(
        [
            "nightly",
            "--config",
            str(write_config(night)),
            "--storage",
            f"sqlite:///{night / 'n.db'}",
            "--skip-if-no-drift",
            "--at",
            DAY2.isoformat(),
        ],
        capsys,
    )
    assert code == 0, (out, err)
    assert "chat: keep" in out and "no drift" in out
    with store_of(night) as store:
        last = decisions(store, "chat")[-1]
    assert last.decision == "keep" and last.study_name is None  # skipped: no study
    assert last.drift is not None and last.drift["drifted"] is False
    assert abs(last.drift["figures"]["prompt_p50"]["change_pct"]) < 15
    out_file = yaml.safe_load((night / "out" / "chat.yaml").read_text(encoding="utf-8"))
    assert out_file["engine_args"] == last.deployed and out_file["decision"] == "keep"
    assert out_file["vllm_serve"].startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct")


def test_prompts_twice_as_long_promote_exit_3(
    night: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trace(night / "traces" / "day2.jsonl", prompt=1400, seed=2, mtime=2_000_000)
    args = [
        "nightly",
        "--config",
        str(write_config(night)),
        "--storage",
        f"sqlite:///{night / 'n.db'}",
        "--skip-if-no-drift",
        "--at",
        DAY2.isoformat(),
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 3, (out, err)
    # idempotent: run again the same day, today's decision is emitted again, not redone
    again = run_cli(args, capsys)
    assert again[0] == 3 and again[1].splitlines()[:2] == out.splitlines()[:2]
    with store_of(night) as store:
        first, last = decisions(store, "chat")
        # the previous study's top configs were projected into today's space
        assert last.projection and all("after" in p for p in last.projection)
        # history and rollback: back to the first night's config
        code_h, hist, _ = run_cli(
            ["nightly", "history", "chat", "--storage", f"sqlite:///{night / 'n.db'}"], capsys
        )
        assert code_h == 0 and hist.count("chat: ") == 2
        back = rollback(store, "chat")
        assert back.deployed == first.deployed and back.decision == "rollback"
    assert last.decision == "promote" and last.reason.startswith("incumbent infeasible")
    assert last.drift is not None and last.drift["drifted"]
    print(f"2x: {last.reason}; gain {last.gain_pct} [{last.gain_low}, {last.gain_high}]")
    print(f"2x: deployed {last.deployed}")
    assert last.challenger is not None and last.deployed == last.challenger
    today = TrafficProfile.from_dict(last.profile or {})
    mml = int(last.deployed["max_model_len"])
    assert today.share_over(3072) > 0.01  # the old max_model_len cuts too many
    assert today.share_over(mml) <= 0.01  # the new one fits
    written = yaml.safe_load((night / "out" / "chat.yaml").read_text(encoding="utf-8"))
    assert written["engine_args"] == first.deployed  # rollback re-emitted the old one


def test_within_noise_keeps(night: Path) -> None:
    write_trace(night / "traces" / "day2.jsonl", prompt=700, seed=2, mtime=2_000_000)
    cfg = load_nightly_config(write_config(night))
    with store_of(night) as store:
        res = run_nightly(cfg, store, now=lambda: DAY2)
    d = res.decision
    print(f"noise: {d.reason}; gain {d.gain_pct} [{d.gain_low}, {d.gain_high}]")
    # a +0.0 % gain, inside the server's noise band: nothing promoted, and no "keep"
    # either (docs/tuning.md#7-validation); the incumbent stays deployed, exit 0
    assert res.exit_code == 0 and d.decision == "too-noisy"
    assert d.reason.startswith("too noisy to tell on this server")
    assert d.gain_low is not None and d.gain_high is not None
    assert d.gain_low <= cfg.min_gain_pct < d.gain_high  # the noise band holds the threshold
    assert d.deployed == d.incumbent and d.study_name == "chat-20261202"


def test_dry_run_records_the_decision_but_writes_no_file(night: Path) -> None:
    (night / "out" / "chat.yaml").unlink()
    write_trace(night / "traces" / "day2.jsonl", prompt=1400, seed=2, mtime=2_000_000)
    cfg = load_nightly_config(write_config(night, dry_run=True))
    with store_of(night) as store:
        res = run_nightly(cfg, store, now=lambda: DAY2)
        rows = decisions(store, "chat")
    assert res.exit_code == 3 and res.decision.decision == "promote"
    assert rows[-1].dry_run and rows[-1].output_path is None
    assert rows[-1].deployed == rows[-1].incumbent  # nothing deployed in a dry run
    assert not (night / "out" / "chat.yaml").exists()


def test_overlapping_runs_second_exits_with_one_line(
    night: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{night / 'n.db'}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from autotune.nightly.job_lock import held_lock
                from autotune.store import Store
                with Store.open({url!r}) as s, held_lock(s, "nightly:chat", "busy"):
                    print("held", flush=True)
                    sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, out, err = run_cli(
            ["nightly", "--config", str(write_config(night)), "--storage", url], capsys
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    assert code == 6 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: a nightly run of deployment 'chat' is already running")
    with store_of(night) as store:
        assert len(decisions(store, "chat")) == 1  # the second run changed nothing
