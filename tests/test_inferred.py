"""A trial that differs from a measured one only in a max_num_seqs neither engine reached takes
that trial's levels and starts no worker (docs/tuning.md#14-settling-losing-trials, "A limit
the engine never reached"): the inferred levels are the ones a worker would have measured,
the limit that did bind is never inferred, and the quickstart study recommends the same
config with the same figures for fewer GPU-seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.runners import SIM_VOCAB, sim_http_runner
from support.studies import config

from autotune.config import parse_config
from autotune.loadgen.bench_stats import RequestRecord
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.report.notes import trial_note
from autotune.report.tables import show_rows, show_table
from autotune.store import Store
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.http_runner import client_peaks
from autotune.tuning.measure.inferred import (
    KeptTrial,
    _NotStored,
    _stored_levels,
    _StoredRunner,
    infer,
)
from autotune.tuning.measure.level_plan import LevelPlan, Measured, SettleBar, measure
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.workload.build import build_workload

ROOT = Path(__file__).resolve().parents[1]
ARGS = {"max_model_len": 4096, "max_num_batched_tokens": 2048}


def _runner(plan: LevelPlan) -> VirtualRunner:
    return VirtualRunner(
        get_model("meta-llama/Llama-3.1-8B-Instruct"),
        get_hardware("A100-80GB"),
        model_name="m",
        static_args={},
        seed=7,
        jitter_cv=0.015,
        early_stop=plan.early_stop,
    )


async def _measured(plan: LevelPlan, wl: Any, mns: int, settle: SettleBar | None) -> Measured:
    runner = _runner(plan)
    await runner.start({**ARGS, "max_num_seqs": mns}, "t")
    try:
        return await measure(runner, wl, plan, settle=settle)
    finally:
        await runner.stop()


def _figures(m: Measured) -> list[tuple[float, dict[str, Any], bool]]:
    return [(lv.outcome.scale, lv.outcome.metrics.to_dict(), lv.score.feasible) for lv in m.levels]


async def test_an_unreached_max_num_seqs_is_inferred_and_equals_the_measurement() -> None:
    cfg, _ = config(workload={"num_prompts": 200})
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload)
    twin = await _measured(plan, wl, 256, None)
    peak = max(lv.outcome.peaks.running for lv in twin.levels if lv.outcome.peaks is not None)
    assert 1 < peak < 256
    kept = [KeptTrial(3, {**ARGS, "max_num_seqs": 256}, None, twin.levels)]

    # above the peak: the same engine at every level, so its search is the twin's levels
    got = await infer({**ARGS, "max_num_seqs": peak + 1}, kept, wl, plan, settle=None, draws=True)
    assert got is not None and got.twin == 3 and got.running == peak
    real = await _measured(plan, wl, peak + 1, None)
    assert _figures(got.measured) == _figures(real)
    assert got.measured.capacity == real.capacity
    assert "inferred from trial 3" in got.line() and f"at most {peak} requests" in got.line()

    # at the peak the limit may have bound: measured, never inferred
    assert (
        await infer({**ARGS, "max_num_seqs": peak}, kept, wl, plan, settle=None, draws=True) is None
    )
    # another difference than max_num_seqs: a different engine
    other = {**ARGS, "max_num_batched_tokens": 4096, "max_num_seqs": peak + 1}
    assert await infer(other, kept, wl, plan, settle=None, draws=True) is None
    # no twin at all
    assert await infer({**ARGS, "max_num_seqs": 300}, [], wl, plan, settle=None, draws=True) is None


async def test_a_settled_trial_stands_only_on_levels_run_under_its_own_stop_rule() -> None:
    """A settle point's first run stops only past the noise band: a twin settled at the same
    bar with the same band ran the same level, so it stands for the trial; one whose band was
    narrower stopped that level under a stricter rule, so the trial gets a worker."""
    cfg, _ = config(workload={"num_prompts": 200})
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload)
    full = await _measured(plan, wl, 256, None)
    assert full.capacity is not None and full.capacity.scale is not None
    above = plan.lattice.scale(plan.lattice.index(full.capacity.scale) + 20)
    for band in (1.0, 3.0):
        bar = SettleBar(above, 3, band_pct=band)
        twin = await _measured(plan, wl, 256, bar)
        assert twin.capacity is not None and twin.capacity.status == "settled"
        assert twin.levels[0].outcome.stop is not None  # stopped past the band
        peak = max(lv.outcome.peaks.running for lv in twin.levels if lv.outcome.peaks is not None)
        kept = [KeptTrial(3, {**ARGS, "max_num_seqs": 256}, bar, twin.levels)]
        args = {**ARGS, "max_num_seqs": peak + 1}
        got = await infer(args, kept, wl, plan, settle=bar, draws=True)
        real = await _measured(plan, wl, peak + 1, bar)
        assert got is not None and _figures(got.measured) == _figures(real)
        assert got.measured.capacity == real.capacity
        wider = SettleBar(above, 3, band_pct=band + 30.0)
        assert await infer(args, kept, wl, plan, settle=wider, draws=True) is None


async def test_a_stored_level_answers_only_its_own_load_draw_and_stop_rule() -> None:
    """The stored runner's three checks, each alone: a level the twin stopped stands only
    for the rule it stopped under; one it ran to its end also for a looser rule; a re-run
    with fresh noise (another draw) is never the twin's first run."""
    cfg, _ = config(workload={"num_prompts": 200})
    plan = LevelPlan.of(cfg)
    wl = build_workload(cfg.workload)
    twin = await _measured(plan, wl, 256, None)
    levels = _stored_levels(KeptTrial(3, {**ARGS, "max_num_seqs": 256}, None, twin.levels), plan)
    stopped = next(lv.outcome for lv in twin.levels if lv.outcome.stop is not None)
    full = next(lv.outcome for lv in twin.levels if lv.outcome.stop is None)
    assert plan.early_stop is not None
    looser = plan.early_stop.widened(1.3)

    def runner() -> _StoredRunner:
        return _StoredRunner(levels, 10_000, plan, draws=True)

    assert await runner().run_level(wl, stopped.scale) is stopped  # its own rule
    r = runner()
    r.set_early_stop(looser)
    with pytest.raises(_NotStored):  # stopped under a stricter rule than asked
        await r.run_level(wl, stopped.scale)
    r = runner()
    r.set_early_stop(looser)
    assert await r.run_level(wl, full.scale) is full  # ran to its end: any looser rule
    r = runner()
    r.redraw(1)
    with pytest.raises(_NotStored):  # fresh noise
        await r.run_level(wl, full.scale)
    with pytest.raises(_NotStored):  # a load the twin never measured
        await runner().run_level(wl, plan.lattice.scale(1))
    with pytest.raises(_NotStored):  # the limit: its engine ran that many
        await _StoredRunner(levels, 1, plan, draws=True).run_level(wl, full.scale)


def test_the_clients_peak_counts_warm_ups_and_failed_requests() -> None:
    def rec(sent: float | None, done: float, warmup: bool = False) -> RequestRecord:
        return RequestRecord(
            request_id="r",
            success=True,
            error="",
            http_status=200,
            prompt_len=1,
            prompt_tokens=1,
            output_tokens=1,
            scheduled_at=sent or 0.0,
            sent_at=sent,
            finished_at=done,
            warmup=warmup,
        )

    records = [
        rec(-2.0, -1.0, warmup=True),
        rec(-2.0, -0.5, warmup=True),
        rec(-2.0, -0.5, warmup=True),  # three warm-ups at once
        rec(0.0, 5.0),
        rec(1.0, 2.0),  # failed at 2.0: finished then
        rec(None, 0.0),  # never sent: never in flight
    ]
    peaks = client_peaks(records, None)
    assert peaks.running == 3 and peaks.kv_usage is None and peaks.preemptions is None


async def test_over_http_the_clients_bound_is_at_least_the_engines_own_count(
    tmp_path: Path,
) -> None:
    """Against the simulator's API server (a real process speaking vLLM's API and
    /metrics): a level run to its end bounds the running requests by at least every running
    count the scrapes saw, with the preemption counter and KV usage from the scrape; a level
    the early stop ended bounds nothing."""
    cfg, _ = config(workload={"num_prompts": 200})
    wl = build_workload(cfg.workload, vocab_size=SIM_VOCAB)
    runner = sim_http_runner(cfg, tmp_path / "w")
    await runner.start({"max_num_seqs": 64}, "trial-0000")
    try:
        # no early stop on the level that must run to its end: at 10x time a busy machine's
        # stalls read as latency, and a stop there would test nothing
        out = await runner.run_level(wl, 2.0)
        runner.set_early_stop(LevelPlan.of(cfg).early_stop)
        # far past capacity the level stops, cutting requests in flight that its records
        # leave out: its client count bounds nothing, so it stands for no other trial
        stopped = await runner.run_level(wl, 40.0)
    finally:
        await runner.stop()
    assert stopped.metrics.stop is not None and stopped.peaks is None
    peaks, tel = out.peaks, out.telemetry
    assert peaks is not None and tel is not None
    seen = tel.gauges["running"].max
    assert seen >= 1 and peaks.running >= seen
    assert peaks.running <= len(wl.requests) + 8  # the measured requests and warm-ups at most
    assert peaks.preemptions == 0 and peaks.kv_usage == tel.gauges["kv_usage"].max


def _quickstart(tmp_path: Path, infer_on: bool) -> tuple[Store, str]:
    d = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    d.setdefault("strategy", {})["infer"] = infer_on
    text = yaml.safe_dump(d)
    cfg = parse_config(text, "quickstart.yaml")
    store = Store.open(f"sqlite:///{tmp_path / ('on' if infer_on else 'off')}.db")
    create_study(cfg, text, store)
    run_study(cfg.name, store)
    return store, cfg.name


@pytest.mark.slow
@pytest.mark.config_field("strategy.infer")
def test_the_quickstart_infers_trials_and_keeps_every_figure(tmp_path: Path) -> None:
    on, name = _quickstart(tmp_path, True)
    off, _ = _quickstart(tmp_path, False)
    with on, off:
        a, b = on.trials(name), off.trials(name)
        inferred = [t for t in a if t.inferred_from is not None]
        assert inferred  # the quickstart's max_num_seqs passes propose unreached values
        assert not any(t.inferred_from is not None for t in b)
        for x, y in zip(a, b, strict=True):
            assert (x.engine_args, x.state, x.objective, x.capacity_scale) == (
                y.engine_args,
                y.state,
                y.objective,
                y.capacity_scale,
            )
            assert [(lv.scale, lv.feasible, lv.output_throughput) for lv in x.levels] == [
                (lv.scale, lv.feasible, lv.output_throughput) for lv in y.levels
            ]
        by = {t.optuna_trial_number: t for t in a}
        for t in inferred:
            twin = by[int(t.inferred_from or 0)]
            assert twin.inferred_from is None and twin.usage is not None
            assert {k: v for k, v in t.engine_args.items() if k != "max_num_seqs"} == {
                k: v for k, v in twin.engine_args.items() if k != "max_num_seqs"
            }
            assert t.usage is None and t.launch_command is None
        # what the inferred trials cost when measured is what the study saved
        saved = sum(
            y.usage.gpu_s
            for x, y in zip(a, b, strict=True)
            if x.inferred_from is not None and y.usage
        )
        ca, cb = study_cost(a), study_cost(b)
        assert saved > 0 and ca.gpu_s == pytest.approx(cb.gpu_s - saved)
        assert ca.worker_starts == cb.worker_starts - len(inferred)
        assert f"({len(inferred)} inferred without a worker)" in ca.text
        assert ca.trials + ca.inferred == cb.trials
        # what people see: the table's state, the export's row and the dashboard's note
        rows = show_rows(a)
        for t in inferred:
            [row] = [r for r in rows if r["trial"] == t.optuna_trial_number]
            assert row["inferred_from"] == t.inferred_from
            assert f"**Inferred** from trial {t.inferred_from}" in trial_note(t, "slo-capacity")
        assert not any("Inferred" in trial_note(t, "slo-capacity") for t in b)
        _, legend, _ = show_table(name, rows, 200)
        assert "inferred = the levels of a trial" in legend
