"""``run_trial`` (autotune/tuning/measure/trial.py) down every branch, driven by a scripted runner
(tests/support/runners.py): a clean capacity search, a start-up failure, a death under load
(the configuration's, and one from outside that a first attempt retries), an interrupt in
the middle of a level, and the over-length stop of the capacity search. What is checked is
what a study keeps: the returned outcome, the stored trial and its levels, and that the
worker is always stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.databases import make_study
from support.runners import ScriptedRunner, feasible_up_to
from support.studies import config

from autotune.errors import WorkerStartupError
from autotune.failures import FailureClass, FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.store import Store
from autotune.tuning.measure.trial import TrialOutcome, TrialSetup, run_trial
from autotune.workload.build import build_workload

ENGINE_ARGS = {"max_num_seqs": 64, "max_model_len": 4096}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as s:
        yield s


async def trial(
    store: Store, runner: ScriptedRunner, *, first_attempt: bool = False, **over: Any
) -> TrialOutcome:
    """One trial of the test study (slo-capacity unless ``over`` says otherwise)."""
    cfg, _ = config(workload={"num_prompts": 40}, **over)
    if store.get_study(cfg.name) is None:
        store.create_study(make_study(cfg.name))
    setup = TrialSetup(cfg, runner, build_workload(cfg.workload), store, cfg.name)
    return await run_trial(
        setup,
        number=0,
        stage="baseline",
        params={"max_num_seqs": 64},
        engine_args=ENGINE_ARGS,
        first_attempt=first_attempt,
    )


def levels_run(runner: ScriptedRunner) -> list[float]:
    return [arg for what, arg in runner.calls if what == "level"]


def stopped_once(runner: ScriptedRunner) -> bool:
    return runner.calls[-1] == ("stop", None) and [c for c, _ in runner.calls].count("stop") == 1


async def test_a_clean_trial_searches_the_lattice_and_stores_every_level(store: Store) -> None:
    runner = ScriptedRunner(levels=feasible_up_to(2.0))
    out = await trial(store, runner)
    assert out.failure_class is None and out.retry is None
    (rec,) = store.trials("t")
    # 4 levels (the study's capacity_levels) end on the best feasible point measured, below
    # the true capacity of 2.0 and within a fifth of it
    held = [lvl.scale for lvl in rec.levels if lvl.feasible]
    assert out.score.feasible and out.score.capacity_scale == max(held)
    assert 1.6 <= max(held) <= 2.0
    assert rec.state == "COMPLETE" and rec.feasible is True and rec.failure_class is None
    assert rec.launch_command == "vllm serve fake" and rec.kv_cache_tokens == 50_000
    assert [lvl.scale for lvl in rec.levels] == levels_run(runner)
    assert len(rec.levels) == 4  # the study's capacity_levels
    assert {lvl.feasible for lvl in rec.levels} == {True, False}
    assert stopped_once(runner)


async def test_fixed_rate_runs_one_level_at_the_workloads_rate(store: Store) -> None:
    runner = ScriptedRunner(levels=feasible_up_to(2.0))
    out = await trial(store, runner, mode="fixed-rate")
    assert levels_run(runner) == [1.0]
    assert out.failure_class is None and out.score.feasible
    (rec,) = store.trials("t")
    assert [(lvl.scale, lvl.feasible) for lvl in rec.levels] == [(1.0, True)]


async def test_a_startup_failure_is_a_complete_infeasible_trial_with_the_log(
    store: Store,
) -> None:
    exc = WorkerStartupError("KV cache too small for max_model_len", FailureClass.KV_TOO_SMALL)
    exc.log_tail = "line 1\nValueError: KV cache too small"  # type: ignore[attr-defined]
    exc.startup_s = 7.5  # type: ignore[attr-defined]  # start-up got that far
    runner = ScriptedRunner(start_error=exc)
    out = await trial(store, runner)
    assert out.failure_class == "KV_TOO_SMALL" and out.retry is None
    assert not out.score.feasible
    (rec,) = store.trials("t")
    assert rec.state == "COMPLETE" and rec.feasible is False
    assert rec.failure_class == "KV_TOO_SMALL" and rec.levels == []
    assert rec.log_tail == "line 1\nValueError: KV cache too small"
    assert rec.startup_s == 7.5 and rec.launch_command is None
    assert levels_run(runner) == [] and stopped_once(runner)


async def test_a_death_under_load_keeps_the_partial_level_and_ends_the_trial(
    store: Store,
) -> None:
    runner = ScriptedRunner(levels=feasible_up_to(2.0), die_after=1)
    out = await trial(store, runner, first_attempt=True)  # the config's doing: no retry
    assert out.failure_class == "RUNTIME_OOM" and out.retry is None
    assert not out.score.feasible
    assert len(levels_run(runner)) == 2  # nothing after the death
    (rec,) = store.trials("t")
    assert rec.state == "COMPLETE" and rec.failure_class == "RUNTIME_OOM"
    first, dead = rec.levels
    assert dead.feasible is False  # whatever it measured: never feasible
    assert dead.scale == levels_run(runner)[1] and first.scale == levels_run(runner)[0]
    assert (rec.log_tail or "").startswith("worker died: torch.OutOfMemoryError")
    assert stopped_once(runner)


@pytest.mark.parametrize(
    ("failure", "first_attempt", "state", "head"),
    [
        (FailureClass.KILLED, True, "FAIL", "attempt failed (KILLED)"),
        (FailureClass.HUNG, True, "FAIL", "attempt failed (HUNG)"),
        (FailureClass.KILLED, False, "COMPLETE", "worker died: "),  # the retry itself
        (FailureClass.HUNG, False, "COMPLETE", "worker hung: "),
    ],
)
async def test_a_death_from_outside_fails_only_a_first_attempt(
    store: Store, failure: FailureClass, first_attempt: bool, state: str, head: str
) -> None:
    runner = ScriptedRunner(die_after=0, death=FailureMatch(failure, "signal 9 from outside"))
    out = await trial(store, runner, first_attempt=first_attempt)
    assert out.failure_class == str(failure)
    assert (out.retry is not None) == first_attempt
    (rec,) = store.trials("t")
    assert rec.state == state and rec.failure_class == str(failure)
    assert (rec.log_tail or "").startswith(head)
    assert len(rec.levels) == 1 and rec.levels[0].feasible is False
    assert stopped_once(runner)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, asyncio.CancelledError])
async def test_an_interrupt_mid_level_stops_the_worker_and_marks_the_trial_failed(
    store: Store, interrupt: type[BaseException]
) -> None:
    runner = ScriptedRunner(raise_in_level=(1, interrupt()))
    with pytest.raises(interrupt):
        await trial(store, runner)
    (rec,) = store.trials("t")
    assert rec.state == "FAIL" and rec.finished_at is not None
    assert len(rec.levels) == 1  # the level that finished before it is kept
    assert stopped_once(runner)


async def test_requests_too_long_for_the_model_stop_the_capacity_search(store: Store) -> None:
    def overlength(scale: float) -> LevelMetrics:  # SLOs met, a third refused for length
        return LevelMetrics(
            completed=60,
            failed=30,
            over_length=30,
            duration_s=10.0,
            p99_ttft_ms=400.0,
            p99_tpot_ms=20.0,
            request_throughput=4.0 * scale,
        )

    runner = ScriptedRunner(levels=overlength)
    out = await trial(store, runner)
    assert len(levels_run(runner)) == 1  # no load level helps: the search stops at once
    assert not out.score.feasible and out.failure_class is None
    (rec,) = store.trials("t")
    (lvl,) = rec.levels
    assert lvl.feasible is False and lvl.over_length == 30
    assert [v["name"] for v in lvl.violations] == ["overlength_rate"]
    assert stopped_once(runner)
