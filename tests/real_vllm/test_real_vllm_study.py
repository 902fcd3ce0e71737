"""A three-trial ``fixed-rate`` study with ``worker: vllm`` on PostgreSQL, through the CLI.

Each trial launches real vLLM through the study controller: the baseline and one sampled
config serve the workload; the enqueued config (``max_num_batched_tokens`` below
``max_num_seqs``) is refused by vLLM at startup, and the study still completes, with that
trial COMPLETE, infeasible, objective 0, and vLLM's failure class and text stored.

The model's tokenizer is foreign to autotune's word list (``foreign_model``), as real users'
tokenizers are, and the study sends chat requests: every prompt is built through the server's
``/detokenize`` and ``/tokenize`` and must measure within max(1 %, 2 tokens) of its requested
length on the real server (docs/loadgen.md#42-chat-prompts).
"""

from __future__ import annotations

import math
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from support.databases import fresh_database  # tests/ is on sys.path, as for tests/test_study.py
from support.lifetimes import ChildLifetimes
from typer.testing import CliRunner

from autotune.cli import app
from autotune.store import Store

from .support import SERVED_MODEL, SERVER_KV_BYTES, TIMINGS, WORKER_ENV, Captures

pytestmark = [pytest.mark.real_vllm, pytest.mark.postgres]

NUM_PROMPTS = 12


def study_config(name: str, venv: Path, model: Path, workdir: Path) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": str(model), "served_name": SERVED_MODEL},
        "hardware": "test-4GB",
        "worker": {
            "kind": "vllm",
            "vllm_executable": [str(venv / "bin" / "vllm")],
            "static_args": {"enforce_eager": True, "kv_cache_memory_bytes": SERVER_KV_BYTES},
            "env": dict(WORKER_ENV),
            "startup_timeout_s": 300,
            "workdir": str(workdir),
        },
        "workload": {
            "source": "synthetic",
            "num_prompts": NUM_PROMPTS,
            "input_len": 64,
            "output_len": 32,
            "arrival": "poisson",
            # 2 req/s: the server, its engine and this client share 2 cores; at 4 a host
            # busy with other work read the streams late (docs/loadgen.md#5-client-limited-levels)
            "rate": 2,
            "seed": 0,
            "endpoint": "chat",
        },
        "slo": {"p99_ttft_ms": 10000, "p99_tpot_ms": 1000},
        "mode": "fixed-rate",
        "enqueue": [{"max_num_seqs": 64, "max_num_batched_tokens": 32}],
        # no validation phase: re-measuring on real vLLM would add minutes of CI
        # the process path on real vLLM, not level length: the 12-request sample as it is
        # (docs/tuning.md#13-level-length loops it to 30 s and 200 requests by default,
        # minutes per trial here)
        "strategy": {
            "name": "joint",
            "n_trials": 3,
            "validate": {"enabled": False},
            "min_level_s": 0,
            "min_level_requests": 0,
        },
        "seed": 0,
    }


@pytest.fixture
def short_workdir() -> Iterator[Path]:
    """Trial folders under a short path: vLLM's ZMQ socket paths in each trial's TMPDIR must
    stay under 107 characters (see test_deep_workdir_still_starts)."""
    path = Path(tempfile.mkdtemp(prefix="atw-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_three_trial_fixed_rate_study_on_postgres(
    vllm_venv: Path, foreign_model: Path, tmp_path: Path, short_workdir: Path, captures: Captures
) -> None:
    name = f"real-vllm-{secrets.token_hex(3)}"
    cfg_path = tmp_path / "study.yaml"
    cfg_path.write_text(yaml.safe_dump(study_config(name, vllm_venv, foreign_model, short_workdir)))
    runner = CliRunner()
    with fresh_database("postgres", tmp_path) as url:
        up = runner.invoke(app, ["db", "upgrade", "--storage", url])
        assert up.exit_code == 0, up.output
        t0 = time.monotonic()
        # each `vllm serve` this process launches, from its start in /proc to its exit
        with ChildLifetimes() as lives:
            r = runner.invoke(
                app, ["study", "create", "--config", str(cfg_path), "--storage", url, "--run"]
            )
        TIMINGS["study: 3 trials on real vLLM"] = time.monotonic() - t0
        assert r.exit_code == 0, (r.output, r.exception)
        assert "3 trial(s) run" in r.output
        with Store.open(url) as store:
            trials = store.trials(name)
            assert [t.stage for t in trials] == ["baseline", "enqueue-0", "joint"]
            assert all(t.state == "COMPLETE" for t in trials)
            ok, bad, third = trials
            # the baseline served the whole workload on real vLLM
            assert ok.failure_class is None and ok.feasible is True, ok.log_tail
            assert ok.levels[0].completed == NUM_PROMPTS and ok.levels[0].failed == 0
            assert ok.launch_argv is not None and ok.launch_argv[:2] == [
                str(vllm_venv / "bin" / "vllm"),
                "serve",
            ]
            assert "--kv-cache-memory-bytes" in ok.launch_argv
            assert ok.kv_cache_tokens == SERVER_KV_BYTES // 512
            assert ok.startup_s is not None and ok.startup_s > 0
            # the enqueued config: refused by vLLM, classified, infeasible, objective 0
            assert bad.failure_class == "MNBT_LT_MNS" and bad.objective == 0
            assert bad.feasible is False and all(c > 0 for c in bad.constraints)
            assert "must be greater than or equal to max_num_seqs" in (bad.log_tail or "")
            assert third.failure_class is None, (third.failure_class, third.log_tail)
            assert third.levels and third.levels[0].completed == NUM_PROMPTS
            # the chat prompts measured on the real server as requested, on a foreign tokenizer
            for served in (ok, third):
                m = served.levels[0].metrics
                assert m["prompts_off_length"] == 0, m
                assert abs(m["prompt_len_deviation"]) <= 0.01, m
            m = ok.levels[0].metrics
            captures.note(
                "prompt_lengths",
                "study chat on the foreign tokenizer",
                {"requested": m["requested_input_tokens"], "measured": m["total_input_tokens"]},
            )
        with Store.open(url) as store:
            ft = optuna.load_study(study_name=name, storage=store.optuna_storage()).trials
        assert [t.state for t in ft] == [optuna.trial.TrialState.COMPLETE] * 3
        assert ft[1].user_attrs["failure_class"] == "MNBT_LT_MNS" and ft[1].value == 0
    # what the study says its workers cost is what they lived, as the OS recorded it
    # (docs/cost.md#1-what-is-counted): three launches, the refused one included
    assert len(lives.lifetimes) == 3, lives.lifetimes
    reported = [t.usage for t in trials]
    assert all(u is not None and not u.cost_modelled and u.devices_held == 1 for u in reported)
    total = sum(u.gpu_s for u in reported if u is not None)
    assert math.isclose(total, sum(lives.lifetimes.values()), rel_tol=0.05), (
        total,
        lives.lifetimes,
    )
    captures.note(
        "cost",
        "study: reported worker seconds vs /proc lifetimes",
        {"reported_s": round(total, 2), "proc_s": round(sum(lives.lifetimes.values()), 2)},
    )
