"""Real vLLM dying mid-level (docs/vllm.md#9-worker-death); these run last (this file sorts
after the others), because the first one ends the shared server.

1. The shared server's EngineCore is killed during a trial's level: its API server stays up a
   few seconds (``/health`` 503), so the watch's group check must see it.
2. A fresh server of the foreign-tokenizer model first serves ``autotune bench`` (completions
   and chat: requested vs measured prompt lengths on a tokenizer foreign to autotune), then its
   API server is killed during a trial's level.

Each time: no request is sent after the detection, the level ends before its schedule, and the
stored level is flagged partial with the death's cause and signal. Detection times are
reported, not asserted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config import WorkloadConfig, parse_config
from autotune.loadgen.bench import run_bench
from autotune.profiles.models import get_model
from autotune.store import Store
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.trial import TrialSetup, run_trial
from autotune.tuning.run.create import create_study
from autotune.tuning.run.events import Event, LevelProgress
from autotune.workload.build import study_workload

from .support import (
    SERVED_MODEL,
    SERVER_ENGINE_ARGS,
    TIMINGS,
    AdoptedWorker,
    Captures,
    RealServer,
    engine_core_pid,
    group_members,
    make_worker,
)

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

NUM_PROMPTS = 40  # at 4/s: a 10 s schedule


def _config(name: str, model: Path) -> tuple[Any, str]:
    d = {
        "name": name,
        "model": {"name": str(model), "served_name": SERVED_MODEL},
        "hardware": "test-4GB",
        "worker": {"kind": "vllm"},
        "workload": {
            "source": "synthetic",
            "num_prompts": NUM_PROMPTS,
            "input_len": 64,
            "output_len": 32,
            "arrival": "constant",
            "rate": 4,
            "seed": 0,
        },
        "slo": {"p99_ttft_ms": 10000, "p99_tpot_ms": 1000},
        "mode": "fixed-rate",
        # no validation phase: re-measuring on real vLLM would add minutes of CI
        "strategy": {"name": "joint", "n_trials": 1, "validate": {"enabled": False}},
    }
    text = yaml.safe_dump(d)
    return parse_config(text, f"{name}.yaml"), text


async def _kill_mid_level(
    adopted: AdoptedWorker,
    model: Path,
    tmp_path: Path,
    victim: int,
    label: str,
    expected: tuple[str, ...],
) -> dict[str, Any]:
    """One fixed-rate trial on the adopted server; ``victim`` gets SIGKILL once 3 requests
    completed, and the trial ends with one of the failure classes ``expected``. Returns the stored
    death record, after the common checks."""
    cfg, text = _config(label, model)
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        prof = get_model(str(model))
        wl = study_workload(cfg, vocab_size=prof.vocab_size)
        runner = HttpRunner(
            adopted,  # type: ignore[arg-type]
            kind="vllm",
            model_name=SERVED_MODEL,
            endpoint="completions",
            vocab_size=prof.vocab_size,
            time_scale=1.0,
        )
        killed: list[float] = []

        def on_event(e: Event) -> None:
            if isinstance(e, LevelProgress) and e.completed >= 3 and not killed:
                killed.append(time.perf_counter())
                os.kill(victim, signal.SIGKILL)

        setup = TrialSetup(cfg, runner, wl, store, cfg.name, on_event)
        t0 = time.monotonic()
        out = await run_trial(
            setup, number=0, stage="baseline", params={}, engine_args=SERVER_ENGINE_ARGS
        )
        TIMINGS[f"{label}: trial with the kill"] = time.monotonic() - t0
        assert killed, "the level never got going"
        death = adopted.death()
        assert death is not None
        TIMINGS[f"{label}: kill -> detected (s)"] = death.detected_at - killed[0]
        stored_extra = {"kill_to_detection_s": round(death.detected_at - killed[0], 4)}
        assert out.failure_class in expected
        stored_extra["failure_class"] = out.failure_class
        (trial,) = store.trials(cfg.name)
        (lvl,) = trial.levels
        assert lvl.metrics["partial"] is True and lvl.feasible is False
        assert 3 <= lvl.completed < NUM_PROMPTS and lvl.metrics["sent_requests"] < NUM_PROMPTS
        stored = dict(lvl.metrics["worker_death"])
        assert stored["pid"] == victim
        # nothing was sent after the detection; the level ended before its schedule
        assert lvl.metrics["last_sent_at_s"] <= stored["detected_at_s"]
        assert stored["stopped_at_s"] < max(wl.arrivals())
        first = (trial.log_tail or "").splitlines()[0]
        assert first.startswith(f"worker died: {death.message}") and "HTTP/1.1" not in first
        return {**stored, **stored_extra}


async def test_engine_core_killed_mid_level(
    vllm_server: RealServer, tmp_path: Path, captures: Captures
) -> None:
    victim = engine_core_pid(vllm_server.info.pid)
    adopted = AdoptedWorker(vllm_server.worker, vllm_server.info)
    # the API server dies of the lost EngineCore on its own; the EngineCore is not our child,
    # so its status shows only while it is a zombie (~35 ms): the signal, when the watch read
    # it, makes the death KILLED, else it is an engine death (docs/vllm.md#10-whose-death-is-it)
    stored = await _kill_mid_level(
        adopted, vllm_server.model_dir, tmp_path, victim, "enginecore", ("KILLED", "ENGINE_DEAD")
    )
    captures.note("worker_death", "engine_core", stored)
    assert stored["cause"] == "process_exit" and "EngineCore" in (stored["process"] or "")
    assert stored["signal"] in ("SIGKILL", None), stored
    assert stored["failure_class"] == ("KILLED" if stored["signal"] == "SIGKILL" else "ENGINE_DEAD")


async def test_api_server_killed_mid_level(
    vllm_venv: Path, foreign_model: Path, worker_workdir: Path, tmp_path: Path, captures: Captures
) -> None:
    worker = make_worker(vllm_venv, foreign_model, worker_workdir)
    t0 = time.monotonic()
    info = await worker.start(SERVER_ENGINE_ARGS, "foreign")
    TIMINGS["foreign-tokenizer server: launch -> ready"] = time.monotonic() - t0
    try:
        lengths = {}
        for endpoint in ("completions", "chat"):
            wl = WorkloadConfig(
                source="random",
                num_prompts=8,
                input_len=300,
                output_len=4,
                range_ratio=0.5,
                arrival="all-at-once",
                endpoint=endpoint,  # type: ignore[arg-type]
            )
            t1 = time.monotonic()
            out = await run_bench(
                info.base_url,
                wl,
                endpoint=endpoint,  # type: ignore[arg-type]
                max_concurrency=4,
            )
            TIMINGS[f"foreign bench {endpoint} (prompt building included)"] = time.monotonic() - t1
            recs = [r for r in out.result.records if not r.warmup]
            assert all(r.success for r in recs), [r.error for r in recs]
            pairs = [(r.prompt_len, r.prompt_tokens) for r in recs]
            lengths[endpoint] = pairs
            s = out.result.summary
            assert s["prompts_off_length"] == 0, pairs
            if endpoint == "completions":  # token ids: exact by construction
                assert all(a == b for a, b in pairs), pairs
        captures.note("prompt_lengths", "bench on the foreign tokenizer", lengths)
        # a SIGKILL from outside: not the configuration's doing (docs/vllm.md#10-whose-death-is-it)
        stored = await _kill_mid_level(
            AdoptedWorker(worker, info), foreign_model, tmp_path, info.pid, "apiserver", ("KILLED",)
        )
        captures.note("worker_death", "api_server", stored)
        assert stored["cause"] == "leader_exit" and stored["signal"] == "SIGKILL"
        assert stored["returncode"] == -signal.SIGKILL
    finally:
        await worker.stop()
    assert not group_members(info.pid)
