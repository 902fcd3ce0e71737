"""A run's trials: each lane (docs/parallel.md#2-lanes) claims the next trial of the plan,
runs it and tells Optuna its result, until the plan, ``n_trials`` or the time limit ends the
run; a completed plan is followed by the validation phase (docs/tuning.md#7-validation)."""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable, Mapping
from typing import Any

from optuna.trial import TrialState

from autotune.config import StudyConfig
from autotune.store.optuna_ids import trial_id
from autotune.tuning import attrs, study_attrs
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.measure.findings import trial_summary
from autotune.tuning.measure.inferred import KeptTrial, infer
from autotune.tuning.measure.runner_protocol import Redrawable
from autotune.tuning.measure.scoring import Slo, record_rank
from autotune.tuning.measure.trial import TrialOutcome, TrialSetup, run_trial
from autotune.tuning.measure.validate import ValidationOutcome, run_validation
from autotune.tuning.run.claims import Claimed, Done
from autotune.tuning.run.context import RunContext, RunReport
from autotune.tuning.run.events import RunStart, TrialAbandoned, on_lane
from autotune.tuning.run.gpu_budget import estimate, over_budget, simulated_capacity
from autotune.tuning.run.lanes import RunBudget, run_lanes
from autotune.tuning.run.settling import full_search, settle_bar
from autotune.tuning.run.twin_refresh import refresh_twin
from autotune.tuning.search.strategy import MEASURED, planned_total

__all__ = ["GPU_BUDGET", "optuna_value", "run_trials"]

GPU_BUDGET = "gpu budget"  # why a run ended: the next trial would pass strategy.gpu_hours


def optuna_value(cfg: StudyConfig, out: TrialOutcome) -> float:
    """What the sampler maximises: the objective, except in ``fixed-rate`` mode, where
    every feasible trial serves the offered rate and the worst SLO margin's headroom ranks
    them (docs/tuning.md#9-the-fixed-rate-objective); an infeasible trial scores 0."""
    if cfg.mode != "fixed-rate":
        return out.score.objective
    if not out.score.feasible:
        return 0.0
    return record_rank(cfg.mode, Slo.of(cfg.slo), out.record)[0] or out.score.objective


async def run_trials(
    ctx: RunContext, recovered: list[str], stop_signal: Callable[[], int | None]
) -> RunReport:
    """Run trials on every lane of ``ctx.plan`` until the run ends (the session is open;
    ``recovered``: what its recovery fixed; ``stop_signal``: the signal that stops the run,
    if one came)."""
    cfg, study, bounds, plan, on_event = ctx.cfg, ctx.study, ctx.bounds, ctx.plan, ctx.on_event
    session = ctx.session
    budget = RunBudget(ctx.n_trials, ctx.timeout)  # the clock starts now
    first = study.get_trials(deepcopy=False)
    planned = planned_total(cfg.strategy, bounds, 1 + len(cfg.enqueue), first)
    if on_event is not None:
        on_event(
            RunStart(
                planned,
                sum(1 for t in first if t.state in MEASURED),
                ctx.timeout,
                tuple(recovered),  # what dead runs left, and how it was fixed
                tuple(",".join(d) for d in plan.lanes) if plan is not None else None,
            )
        )
    assert session.claims is not None and session.recovery is not None
    claims, retried = session.claims, session.recovery.retried
    # strategy.gpu_hours: each trial at this price, the plan line's
    # (docs/cost.md#3-the-plan-and-the-budget)
    price = None
    if cfg.strategy.gpu_hours:
        rec = ctx.store.get_study(cfg.name)
        simulated = simulated_capacity(rec.workload_profile) if rec is not None else None
        price = estimate(cfg, ctx.model, ctx.wl, planned, capacity=simulated)

    def out_of_budget() -> bool:
        if price is None:
            return False
        trials = ctx.store.trials(cfg.name, with_levels=False)
        spent = study_cost(trials, ctx.store.repeats(cfg.name))
        # the baseline's search is a full one, as every validation run is
        full = [t.usage.gpu_s for t in trials if t.stage == "baseline" and t.usage is not None]
        running = budget.reserved - budget.ran - 1
        return over_budget(cfg, price, spent, running, full[-1] if full else None)

    halted: list[str] = []  # why the other lanes stopped, once one lane failed
    # the trials measured in this run, for a later trial to stand on (inferred.py)
    kept: list[KeptTrial] = []

    async def lane(index: int) -> str:
        """Claim and run trials one after another until the run ends (one lane)."""
        setups: dict[str | None, TrialSetup] = {}

        def setup_for(engine_args: Mapping[str, Any]) -> TrialSetup:
            # the lane's devices, or worker.gpus when the run has no --gpus (which the
            # in-process simulator never sees)
            devices = (
                plan.devices_for(index, {**cfg.worker.static_args, **engine_args})
                if plan is not None
                else cfg.worker.gpus
                if cfg.worker.kind != "sim-virtual"
                else None
            )
            if devices not in setups:
                runner = ctx.runner(devices)
                emit = on_event if plan is None else on_lane(on_event, index, devices)
                setups[devices] = TrialSetup(
                    cfg, runner, ctx.wl, ctx.store, cfg.name, emit, devices=devices
                )
            return setups[devices]

        while True:
            if (why := budget.reserve()) is not None:
                return why
            if out_of_budget():  # the search ends here; the validation phase still runs
                budget.release()
                return GPU_BUDGET
            if cfg.strategy.name == "twin":  # refit and re-screen on what was measured
                await refresh_twin(ctx)
            # the next trial, claimed exactly once among every lane of every controller of
            # the study; or wait while others run the rest of the current stage
            got = claims.next(index)
            if not isinstance(got, Claimed):
                budget.release()
                if isinstance(got, Done):
                    return "plan complete"
                await session.idle(got, on_event, index)
                continue
            session.claimed(got)
            trial, stage_name, engine_args = got.trial, got.stage, got.engine_args
            setup = setup_for(engine_args)
            attrs.write_trial_start(study, trial, stage_name, engine_args, cfg.mode)
            attrs.write_devices(trial, setup.devices)  # or a retry's copy of none
            frozen = ctx.store.optuna_storage().get_trial(trial_id(trial))
            # No capacity hint: every trial that is not settled gets the same search as the
            # baseline. Under noise a search started at the best capacity so far finds lucky
            # feasible points up there that a search from the ends never visits
            # (docs/tuning.md#1-the-capacity-lattice). A settled one is measured there first
            # and ends there when it fails (docs/tuning.md#14-settling-losing-trials).
            noise_rec = study_attrs.read_noise(study)
            trials_now = study.get_trials(deepcopy=False)  # the bar and the plan's size
            bar = settle_bar(
                cfg,
                trials_now,
                stage_name,
                noise_rec.band_pct if noise_rec is not None else None,
                compass=attrs.compass_moved(frozen),
            )
            inferred = (
                await infer(
                    engine_args,
                    kept,
                    setup.workload,
                    setup.plan,
                    settle=bar,
                    draws=isinstance(setup.runner, Redrawable),
                )
                if cfg.strategy.infer and not full_search(stage_name)
                else None
            )
            try:
                out = await run_trial(
                    setup,
                    number=trial.number,
                    stage=stage_name,
                    params=trial.params,
                    engine_args=engine_args,
                    # trial numbers are Optuna's (0-based) everywhere; the position counts
                    # complete trials, so a resumed run never reads "trial 7 of 6"
                    # the plan's size as of now: the baseline's diagnosis resizes it
                    position=(
                        got.complete_before + 1,
                        planned_total(
                            cfg.strategy,
                            bounds,
                            1 + len(cfg.enqueue),
                            trials_now,
                        ),
                    ),
                    first_attempt=not attrs.retry_history(frozen),
                    # the server's noise, once per study: a resumed study has it stored
                    noise=stage_name == "baseline" and noise_rec is None,
                    settle=bar,
                    inferred=inferred,
                )
            except BaseException as exc:
                # failed in both stores and queued again, once (docs/faults.md)
                why_failed = halted[0] if halted else _why_stopped(exc, stop_signal())
                line = claims.abandon(got, why_failed)
                session.released(got)
                if line and setup.on_event is not None:
                    setup.on_event(TrialAbandoned(trial.number, line))
                raise
            if out.retry is not None:
                # its worker was killed from outside or hung: this attempt is no verdict; it
                # is failed and the configuration runs again once in a fresh worker
                # (docs/faults.md#10-worker-faults)
                attrs.write_failure_class(trial, out.failure_class)
                line = claims.abandon(got, out.retry)
                session.released(got)
                budget.release()
                if line and setup.on_event is not None:
                    setup.on_event(TrialAbandoned(trial.number, line))
                continue
            if out.levels and out.record.inferred_from is None:
                kept.append(KeptTrial(trial.number, dict(engine_args), bar, out.levels))
            if out.noise is not None:  # docs/tuning.md#7-validation
                study_attrs.write_noise(study, out.noise)
            # constraints and attributes, then the trial's note (docs/report.md)
            attrs.write_trial_summary(study, trial, trial_summary(out, cfg), out.score.constraints)
            if ctx.hooks is not None:
                ctx.hooks.trial_told(trial, out, cfg)
            if out.record.state == "PRUNED":  # settled: its capacity is only bounded
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, optuna_value(cfg, out))
            claims.finish(got)
            session.released(got)
            budget.finished()
            if ctx.hooks is not None and ctx.hooks.record is not None:
                # told in both stores: the git record commits it (docs/git-record.md)
                ctx.hooks.record(cfg, ctx.store, False)

    if plan is None or len(plan.lanes) == 1:
        stopped = [await lane(0)]
    else:

        def halt(exc: BaseException) -> None:
            halted.append(_why_stopped(exc, stop_signal()))

        bodies = [functools.partial(lane, i) for i in range(len(plan.lanes))]
        stopped = await run_lanes(bodies, halt)
    # a lane that found the plan complete speaks for the run; else the first limit reached
    stopped_by = next((w for w in ("plan complete", "timeout") if w in stopped), stopped[0])
    runs = 0
    if stopped_by in ("plan complete", GPU_BUDGET):
        # the search is over: re-measure its top configs within the same time limit, one
        # run at a time on the first lane's devices (docs/tuning.md#7-validation)
        gpus = ",".join(plan.lanes[0]) if plan is not None else cfg.worker.gpus
        v = await _validate(ctx, budget.t0, gpus)
        stopped_by, runs = v.stopped_by or stopped_by, v.runs
    return RunReport(budget.ran, stopped_by, session.idle_s, recovered, list(retried), runs)


def _why_stopped(exc: BaseException, signum: int | None) -> str:
    if signum is not None:
        return f"the run was stopped by {signal.Signals(signum).name}"
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return "the run was interrupted"
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"the run failed ({type(exc).__name__}: {first})"


async def _validate(ctx: RunContext, t0: float, gpus: str | None) -> ValidationOutcome:
    """The validation phase (docs/tuning.md#7-validation): its runs are stored in autotune's
    table, its summary is a study attribute for the dashboard."""
    cfg, timeout = ctx.cfg, ctx.timeout
    return await run_validation(
        cfg,
        ctx.store,
        cfg.name,
        make_runner=lambda seed: ctx.runner(
            gpus if cfg.worker.kind != "sim-virtual" else None,
            cfg.model_copy(update={"seed": seed}),
            # the guard protects the study's max_model_len sizing, which a fresh sample
            # does not redo (its text lengths are the approximate ones)
            check_lengths=False,
        ),
        vocab_size=ctx.model.vocab_size,
        deadline=None if timeout is None else t0 + timeout,
        on_event=ctx.on_event,
        publish=lambda summary: study_attrs.write_validation(ctx.study, summary),
        noise=study_attrs.read_noise(ctx.study),
    )
