"""The validation phase (docs/tuning.md#7-validation): after the search, re-measure the top
configs and the baseline on fresh workload samples with fresh jitter, store every run in
``autotune_repeats`` (never as Optuna trials, so trial counts and the dashboard stay the
search's), and publish the summary that :mod:`autotune.tuning.measure.interval` computes.

Every run is one unit of work: a stored row (PENDING, RUNNING, COMPLETE) that measures one
config on one repeat's workload sample with the trials' own protocol
(:mod:`autotune.tuning.measure.validation_run`). The plan
(:mod:`autotune.tuning.measure.validation_plan`) runs the configs in blocks of repeats that
take turns, so that drift over time hits every config alike; a block's runs share one worker,
which the next run keeps when it measures the same config. A run cut short (Ctrl-C) goes back
to PENDING; the next ``study run`` runs what is pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import StorageError
from autotune.store import RepeatRecord, Store, TrialRecord, WorkerUsage
from autotune.tuning.measure.candidates import (
    candidates_of,
    measured_alike,
    runs_can_rank,
    start_of,
    told_apart,
)
from autotune.tuning.measure.early_look import (
    LOOK_VERDICTS,
    final_overlength,
    look_after,
    look_confidence,
    passed_over,
    settled_early,
    tied_with,
)
from autotune.tuning.measure.interval import ValidationSummary, summary_of
from autotune.tuning.measure.noise import NoiseRecord
from autotune.tuning.measure.runner_protocol import Keepable, Runner
from autotune.tuning.measure.scoring import Slo, record_rank
from autotune.tuning.measure.validation_plan import plan_runs, repeat_seeds, run_order
from autotune.tuning.measure.validation_run import (
    RESULT_FIELDS,
    measure_block_run,
    measure_run,
    single_run,
)
from autotune.tuning.run.events import (
    OnEvent,
    ValidationDone,
    ValidationRunDone,
    ValidationRunStart,
    ValidationSettledEarly,
    ValidationStart,
)
from autotune.tuning.search.plan import overlength_rate
from autotune.workload.build import workload_sample
from autotune.workload.core import Workload

__all__ = [
    "ValidationOutcome",
    "candidates_of",
    "measure_run",
    "measured_alike",
    "plan_runs",
    "repeat_seeds",
    "run_validation",
    "single_run",
]

log = logging.getLogger(__name__)

# a runner for one validation run, given the run's jitter seed
RunnerFactory = Callable[[int], Runner]


@dataclass
class ValidationOutcome:
    runs: int  # runs this call made
    stopped_by: str | None  # "timeout" when the run's time ran out first
    summary: ValidationSummary | None  # None: validation off, or nothing to compare


def _plan(
    cfg: StudyConfig, store: Store, name: str, noise: NoiseRecord | None
) -> tuple[list[RepeatRecord], tuple[str, ...]]:
    """The phase's runs (planned now unless stored) and, when planned now, why runners-up
    were left out."""
    runs = store.repeats(name)
    if runs:
        return runs, ()
    slo = Slo.of(cfg.slo)
    base, cands = candidates_of(
        store.trials(name),
        cfg.strategy.validate_.top_k,
        lambda t: record_rank(cfg.mode, slo, t),
    )
    # a runner-up the study already told from the best is not re-measured (told_apart), nor
    # one whose lead the runs could not resolve (runs_can_rank); each with why
    lattice = 100.0 * cfg.strategy.capacity_resolution
    step = lattice if cfg.mode == "slo-capacity" else None
    band = noise.band_pct if noise is not None else None
    left_out: list[tuple[TrialRecord, str]] = []
    for c in cands[1:]:
        if told_apart(cands[0], c, band, step):
            left_out.append(
                (c, f"the study told them apart by more than the server's noise band "
                    f"({band:.1f} %) plus one step")
            )  # fmt: skip
        elif not runs_can_rank(band, lattice):
            left_out.append(
                (c, f"the runs could not rank them, since the server's noise band "
                    f"({band:.1f} %) is below one lattice step ({lattice:g} %)")
            )  # fmt: skip
    dropped = [c for c, _ in left_out]
    cands = [c for c in cands if c not in dropped]
    if base is None or not cands:
        return [], ()  # nothing to compare: the search's own answer stands
    try:
        store.add_repeats(plan_runs(cfg, base, cands))
    except StorageError:
        runs = store.repeats(name)
        if not runs:
            raise
        return runs, ()  # another controller of the study planned it first
    notes = tuple(
        f"trial {c.optuna_trial_number} ({_figure(c, step)} against trial "
        f"{cands[0].optuna_trial_number}'s {_figure(cands[0], step)}): {why}"
        for c, why in left_out
    )
    return store.repeats(name), notes


def _figure(t: TrialRecord, step: float | None) -> str:
    if step is not None and t.capacity_scale:
        return f"capacity x{t.capacity_scale:.3f}"
    return f"{t.objective or 0.0:,.1f}"


async def run_validation(
    cfg: StudyConfig,
    store: Store,
    name: str,
    *,
    make_runner: RunnerFactory,
    vocab_size: int,
    deadline: float | None = None,
    on_event: OnEvent | None = None,
    publish: Callable[[dict[str, Any]], None] | None = None,
    noise: NoiseRecord | None = None,
) -> ValidationOutcome:
    """Plan the phase (once per study), run its pending runs in order until done or
    ``deadline`` (``time.monotonic()``), and ``publish`` the summary once complete; its
    verdict weighs the gains against the server's ``noise`` when it was measured.
    ``make_runner(seed)``: a runner for the runs of one noise seed, built without the
    length guard (``check_lengths=False``: a fresh sample's text lengths are approximate)."""
    if not cfg.strategy.validate_.enabled:
        return ValidationOutcome(0, None, None)
    emit = on_event or (lambda _e: None)
    runs, apart = _plan(cfg, store, name, noise)
    if not runs:
        return ValidationOutcome(0, None, None)
    pending = [r for r in runs if r.state == "PENDING"]
    if pending:
        emit(ValidationStart(len(runs), len(pending), apart))
    samples: dict[int, Workload] = {}
    made, stopped = 0, None
    # where each config's runs start their search: its capacity in the study, moved as the
    # repeat's sample moved the configs measured on it before (start_of)
    capacity = {
        t.optuna_trial_number: t.capacity_scale for t in store.trials(name, with_levels=False)
    }
    start_at = cfg.strategy.validate_.from_capacity
    pending = run_order(pending, cfg.validation_repeats)
    # the worker the run before kept for the next run of its block, and that run's record
    held: tuple[Runner, RepeatRecord] | None = None
    look = look_after(cfg.validation_repeats) if cfg.strategy.validate_.stop_early else None
    try:
        for i, rec in enumerate(pending):
            assert rec.id is not None
            if deadline is not None and time.monotonic() >= deadline:
                stopped = "timeout"
                break
            if look is not None and rec.repeat_index >= look:
                settled = _settled_at(
                    cfg, store, name, look, noise, _lengths(cfg, samples, vocab_size)
                )
                if settled is not None:
                    dropped = store.drop_pending_repeats(name)
                    emit(ValidationSettledEarly(look, cfg.validation_repeats, dropped, *settled))
                    break
                look = None  # one look: the runs go on to the plan's end
            if not store.claim_repeat(rec.id):
                continue  # another controller of the study runs this one (claimed once)
            if rec.workload_seed not in samples:
                samples[rec.workload_seed] = workload_sample(
                    cfg, rec.workload_seed, vocab_size=vocab_size
                )[0]
            emit(ValidationRunStart(rec.repeat_index, rec.trial_number))
            runner, started = _kept_for(held, rec)
            if held is not None and not started:
                await _release(store, held)
            held = None
            if runner is None:
                runner = make_runner(rec.jitter_seed)
            after = pending[i + 1] if i + 1 < len(pending) else None
            try:
                res, keep = await measure_block_run(
                    cfg,
                    runner,
                    samples[rec.workload_seed],
                    rec,
                    f"validate-{rec.repeat_index}-{rec.trial_number:04d}",
                    start_of(rec, capacity, store.repeats(name)) if start_at else None,
                    started,
                    after is not None and after.engine_args == rec.engine_args,
                )
            except BaseException:
                store.update_repeat(rec.id, state="PENDING", started_at=None)
                raise
            results = {k: getattr(res, k) for k in RESULT_FIELDS}
            store.update_repeat(rec.id, state="COMPLETE", finished_at=datetime.now(UTC), **results)
            if keep:
                held = (runner, res)
            made += 1
            emit(
                ValidationRunDone(
                    rec.repeat_index,
                    rec.trial_number,
                    rec.role,
                    len(runs) - len(pending) + made,
                    len(runs),
                    res,
                    cfg.mode,
                )
            )
    finally:
        if held is not None:
            await _release(store, held)
    summary = summary_of(cfg, store.repeats(name), store.trials(name), noise)
    if summary is not None and summary.complete:
        if publish is not None:
            publish(summary.to_dict())
        emit(ValidationDone(summary))
    return ValidationOutcome(made, stopped, summary)


def _settled_at(
    cfg: StudyConfig,
    store: Store,
    name: str,
    look: int,
    noise: NoiseRecord | None,
    predict: Callable[[RepeatRecord], tuple[float, int] | None],
) -> tuple[int | None, tuple[int, ...], tuple[int, ...]] | None:
    """The early look (docs/tuning.md#7-validation, "Stopping early"): when every run of the
    first ``look`` repeats is done and their verdict at the look's confidence is settled,
    the recommended trial, the rivals passed over because they never led it and those passed
    over as tied with it; else None
    (``predict``: a run's over-length rate and size from its sample's lengths)."""
    every = store.repeats(name)
    runs = [r for r in every if r.repeat_index < look]
    if any(r.state != "COMPLETE" for r in runs):
        return None
    conf = look_confidence(cfg.strategy.validate_.confidence)
    s = summary_of(cfg, runs, store.trials(name), noise, confidence=conf)
    if s is None or s.verdict not in LOOK_VERDICTS:
        return None  # settled_early says no too; this draws no sample for a look that cannot stop
    known = final_overlength(every, predict)
    if not settled_early(s, runs, cfg.slo.max_overlength_rate, known):
        return None
    return s.chosen, passed_over(s, runs), tied_with(s, runs)


def _lengths(
    cfg: StudyConfig, samples: dict[int, Workload], vocab_size: int
) -> Callable[[RepeatRecord], tuple[float, int] | None]:
    """A run's over-length rate as its sample's lengths predict it, and the sample's size
    (None without a ``max_model_len`` in its engine args); samples drawn here are kept for
    the runs."""

    def predict(run: RepeatRecord) -> tuple[float, int] | None:
        mml = run.engine_args.get("max_model_len")
        if mml is None:
            return None
        if run.workload_seed not in samples:
            samples[run.workload_seed] = workload_sample(
                cfg, run.workload_seed, vocab_size=vocab_size
            )[0]
        reqs = samples[run.workload_seed].requests
        rate = overlength_rate(int(mml), [q.prompt_len for q in reqs], [q.output_len for q in reqs])
        return rate, len(reqs)

    return predict


def _kept_for(
    held: tuple[Runner, RepeatRecord] | None, rec: RepeatRecord
) -> tuple[Runner | None, bool]:
    """The kept worker's runner when it serves ``rec``'s config and can take its seed
    (docs/tuning.md#7-validation, "One worker for a block of runs"), and whether it does."""
    if held is None or held[1].engine_args != rec.engine_args:
        return None, False
    runner = held[0]
    if isinstance(runner, Keepable) and runner.reseed(rec.jitter_seed):
        return runner, True
    return None, False


async def _release(store: Store, held: tuple[Runner, RepeatRecord]) -> None:
    """Stop a kept worker no run will use, and charge what it cost since its last split to
    the run that kept it (docs/cost.md#1-what-is-counted)."""
    runner, run = held
    await runner.stop()
    tail, part = runner.usage(), run.usage
    if tail is None or part is None or run.id is None or tail.worker_s <= 0:
        return
    whole = WorkerUsage(
        part.worker_s + tail.worker_s,
        part.worker_startup_s + tail.worker_startup_s,
        part.replayed_s + tail.replayed_s,
        part.devices_held,
        part.cost_modelled,
    )
    store.update_repeat(run.id, **whole.fields())
