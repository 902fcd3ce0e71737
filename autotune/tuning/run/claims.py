"""Claiming the next trial of a study that many controllers share, exactly once
(docs/faults.md#5-exact-budgets-with-many-controllers).

A claim is one short section under the study lock: a recovery pass, the decision which
stage the next trial belongs to (counting the trials other controllers are running as if
they were done), ``ask`` and the suggestions, the trial's stage and engine args, its first
heartbeat and the claim row. On PostgreSQL the claim row commits with the advisory lock's
transaction, so a claim made while the lock was lost (a server restart) never lands; the
trial it asked for is then found abandoned by the next pass and re-queued.

When every trial of the current stage is claimed but some still run, the answer is
:class:`Wait`: the next stage starts from the best point of this one, so it cannot start
before this one is complete. The same holds for the baseline (and ``enqueue:`` configs)
before the first stage, and at the end of the plan (a running trial may still fail and be
retried). Several lanes of one process can share one :class:`Claims` (``lane`` tells their
claims apart).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import SearchConfig, StrategyConfig
from autotune.store import Store
from autotune.store.optuna_ids import trial_id
from autotune.store.resilience import secondary_failure
from autotune.tuning import attrs, study_attrs
from autotune.tuning.run.recovery import Recovery, claim_key
from autotune.tuning.search.edges import widen_at_claim
from autotune.tuning.search.home_size import RECHECK
from autotune.tuning.search.rounding import tidy_steps
from autotune.tuning.search.space import SpaceBounds, enqueue_params, suggest
from autotune.tuning.search.stages import stage_param
from autotune.tuning.search.strategy import (
    MEASURED,
    compass_move,
    next_stage,
    sampler_for,
    stage_params,
)

__all__ = ["Claimed", "Claims", "Done", "Wait", "decide", "stage_order"]

log = logging.getLogger(__name__)

_ENQUEUED = "enqueued"
# a claim that lost its trial to another controller (the lock was lost) is simply redone
_MAX_REDOS = 5


@dataclass
class Claimed:
    """A trial this controller now runs."""

    trial: optuna.Trial
    stage: str
    engine_args: dict[str, Any]
    key: str
    lane: int
    # trials complete or running (other lanes', other controllers') when it was claimed: it
    # is the next one of the plan ("trial k of n")
    complete_before: int


@dataclass(frozen=True)
class Wait:
    """Nothing to claim until other controllers' running trials complete."""

    reason: str
    running: int


@dataclass(frozen=True)
class Done:
    reason: str


def stage_order(stage: str | None, b: SpaceBounds) -> int:
    """Where a stage comes in the plan: the baseline and enqueued configs first, then one
    stage per parameter in the fixed order, the parallelism's re-check, the joint
    refinement, the coordinate passes in their order, then the rest (random, grid)."""
    names = stage_params(b)
    if stage is None or stage == "baseline" or stage == _ENQUEUED or stage.startswith("enqueue-"):
        return 0
    if stage == RECHECK:
        return 1 + len(names)  # the parallelism's re-check decides where the joint runs
    if stage == "joint":
        return 2 + len(names)
    param, k = stage_param(stage)
    if param in names:
        return 1 + names.index(param) if k == 1 else 3 + len(names) * (k - 1) + names.index(param)
    return 3 + len(names) * 1000


def _as_complete(t: FrozenTrial) -> FrozenTrial:
    done = copy.copy(t)
    done.state = TrialState.COMPLETE
    return done


def decide(trials: Sequence[FrozenTrial], st: StrategyConfig, b: SpaceBounds) -> str | Wait | Done:
    """The stage of the next trial to claim, or why there is none now."""
    if any(t.state == TrialState.WAITING for t in trials):
        return _ENQUEUED  # the queue first: the baseline, enqueue: configs, retries
    running = [t for t in trials if t.state == TrialState.RUNNING]
    # as if every running trial were done: the stage budgets then count them as taken
    view = [_as_complete(t) if t.state == TrialState.RUNNING else t for t in trials]
    stage = next_stage(view, st, b, 0)
    if stage is None:
        if running:
            return Wait(
                f"the plan is fully claimed; {len(running)} trial(s) still run", len(running)
            )
        return Done("plan complete")
    order = stage_order(stage, b)
    earlier = [t for t in running if stage_order(attrs.stage_of(t), b) < order]
    if earlier:
        names = sorted({str(attrs.stage_of(t)) for t in earlier})
        return Wait(
            f"stage {stage} starts once {len(earlier)} running trial(s) of "
            f"{', '.join(names)} complete",
            len(earlier),
        )
    return stage


class Claims:
    """The claims of one controller (``controller_id``) on one study."""

    def __init__(
        self,
        store: Store,
        study: optuna.Study,
        name: str,
        controller_id: int,
        *,
        strategy: StrategyConfig,
        bounds: SpaceBounds,
        recovery: Recovery,
        seed_for: Callable[[int], int],
        on_claim: Callable[[int], None] | None = None,
        search: SearchConfig | None = None,
    ) -> None:
        self.store, self.study, self.name = store, study, name
        self.fleet = store.fleet()
        self.controller_id = controller_id
        self.strategy, self.bounds = strategy, bounds
        self.recovery, self.seed_for = recovery, seed_for
        self.on_claim = on_claim  # the trial id, to heartbeat from now on
        self.search = search  # the edges the user set are never widened (tuning/search/edges.py)

    def recover(self, *, full: bool = False) -> list[str]:
        """A recovery pass on its own (a controller's start: ``full``)."""

        def run() -> list[str]:
            with self.fleet.locked(self.name) as lk:
                return self.recovery.sweep(lk, full=full)

        return self.store.resilience.call("recovering the study", run)

    def next(self, lane: int = 0) -> Claimed | Wait | Done:
        """Claim the next trial (or say why not)."""
        for _ in range(_MAX_REDOS):
            try:
                return self.store.resilience.call(
                    "claiming the next trial", lambda: self._claim(lane)
                )
            except optuna.exceptions.UpdateFinishedTrialError:
                log.warning("a trial being claimed was finished by another controller; again")
        raise RuntimeError("could not claim a trial: other controllers kept finishing it")

    def _claim(self, lane: int) -> Claimed | Wait | Done:
        with self.fleet.locked(self.name) as lk:
            for line in self.recovery.sweep(lk):
                log.warning("recovered: %s", line)
            trials = self.recovery.trials
            decision = decide(trials, self.strategy, self.bounds)
            if not isinstance(decision, str):
                return decision
            twin = study_attrs.read_twin(self.study) if decision == "twin" else None
            if decision == "twin" and (twin is None or twin.get("next_args") is None):
                # the latest round (run before every claim) found nothing worth a trial
                why = twin.get("stop") if twin else None
                return Done(f"the twin stopped: {why or 'no round ran'}")
            # the stored bounds, with the edges widened so far; a coordinate pass may widen
            # one the best point sits on, once (docs/tuning.md#8-the-staged-plan)
            bounds, widened = widen_at_claim(self.study, self.bounds, trials, decision, self.search)
            for w in widened:
                log.warning("search widened: %s", w.line())
            with warnings.catch_warnings():
                # the baseline may lie outside the ranges on purpose (vLLM's defaults), and
                # PartialFixedSampler is what the staged method needs, experimental or not
                warnings.filterwarnings("ignore", message=".*out of range.*")
                warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
                # heartbeats are ours (a thread), not study.optimize's
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                sampler = (
                    sampler_for(decision, trials, bounds, self.seed_for(len(trials)), self.strategy)
                    if twin is None
                    else optuna.samplers.PartialFixedSampler(
                        enqueue_params(bounds, twin["next_args"]),
                        optuna.samplers.RandomSampler(seed=self.seed_for(len(trials))),
                    )
                )
                self.study.sampler = tidy_steps(sampler)
                move = (
                    compass_move(trials, bounds)
                    if decision == "joint" and self.strategy.name == "staged" and twin is None
                    else None
                )
                trial = self.study.ask()
                values = suggest(trial, bounds)
                if twin is not None and twin.get("next_predicted") is not None:
                    attrs.write_twin_prediction(trial, twin["next_predicted"])
            engine_args = attrs.enqueued_engine_args(trial) or values.engine_args()
            label = attrs.label_of(trial)
            # a retry keeps its stage; a first enqueued run is named by its label
            stage = str(
                attrs.stage_of(trial)
                or ("baseline" if label == "baseline" else (label or decision))
            )
            # the stage now, under the lock (the claims read it); the engine values follow
            # in record_trial_start
            attrs.write_stage(trial, stage)
            if move is not None and all(trial.params.get(k) == v for k, v in move.items()):
                attrs.write_compass(trial)  # settled at the best (tuning.run.settling)
            # a first heartbeat now: Optuna never counts a trial without one as stale
            self.store.optuna_storage().record_heartbeat(trial_id(trial))
            key = claim_key(trial.number)
            lk.add_claim(
                key,
                controller_id=self.controller_id,
                trial_number=trial.number,
                stage=stage,
                lane=lane,
            )
            done = sum(1 for t in trials if t.state in (*MEASURED, TrialState.RUNNING))
        # heartbeats from now on: only once the claim (and on PostgreSQL the lock's
        # transaction with it) has committed
        if self.on_claim is not None:
            self.on_claim(trial_id(trial))
        return Claimed(trial, stage, engine_args, key, lane, done)

    def finish(self, claimed: Claimed) -> None:
        """The trial was told to Optuna: close its claim."""
        self.fleet.release(self.name, claimed.key, "COMPLETE")
        self.fleet.count_trial(self.controller_id)

    def abandon(self, claimed: Claimed, why: str) -> str | None:
        """The trial ended early (interrupt, crash): fail it in both stores and queue its
        configuration again (once). Best effort: when the database is gone, the next start
        of any controller finds the trial orphaned and does the same."""
        try:

            def run() -> str | None:
                with self.fleet.locked(self.name):
                    frozen = self.store.optuna_storage().get_trial(trial_id(claimed.trial))
                    if frozen.state != TrialState.RUNNING:
                        return None
                    return self.recovery.fail(frozen, why)

            return self.store.resilience.call(f"failing trial {claimed.trial.number}", run)
        except Exception as exc:  # the original error matters more
            secondary_failure(log, f"could not fail trial {claimed.trial.number}", exc)
            return None
