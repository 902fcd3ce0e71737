"""Recovering a shared study from whatever ended a trial early
(docs/faults.md#1-every-unfinished-trial-is-re-run-once).

Every pass runs under the study lock (:meth:`autotune.store.fleet.Fleet.locked`), so exactly
one controller acts on each finding:

- a RUNNING trial nobody claimed was abandoned half-way through a claim (the claiming
  controller died or lost the database): it is failed, and an enqueued configuration is
  put back in the queue as it was (it never ran);
- a RUNNING trial whose controller is dead (its process is gone from this host, it stopped,
  or its heartbeat is older than the grace period) is failed and retried, unless autotune
  already holds its complete result, which Optuna is then told;
- Optuna's own stale-trial check (``fail_stale_trials``) runs next, with
  :meth:`Recovery.on_stale` as its callback;
- a failed trial with no retry yet gets one (``RetryHeartbeatStaleTrialCallback``), keeping
  its parameters, stage and label; a retry that fails again is final (the baseline is
  retried until it completes: without it no gain can be stated);
- with ``full``, autotune's rows are brought to agree with Optuna's states.

Each fix is one line of the report a run prints when it starts.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from autotune.store import Store, TrialRecord
from autotune.store.fleet import ControllerEntry, Fleet, Locked
from autotune.store.optuna_ids import trial_id
from autotune.store.optuna_storage import ResilientStorage
from autotune.tuning import attrs
from autotune.workers.guard import host_name, process_alive, remove_tmpdir, stop_group

__all__ = ["MAX_RETRIES", "Recovery", "claim_key", "successors"]

log = logging.getLogger(__name__)

MAX_RETRIES = 1


def claim_key(number: int) -> str:
    return f"trial:{number}"


def successors(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of the trials that already have a retry (or a re-queued copy)."""
    out: set[int] = set()
    for u in trials:
        history = attrs.retry_history(u)
        if history:
            out.add(history[-1])
        source = attrs.requeued_from(u)
        if source is not None:
            out.add(source)
    return out


def _is_baseline(t: FrozenTrial) -> bool:
    return attrs.label_of(t) == "baseline"


def _may_retry(t: FrozenTrial) -> bool:
    return _is_baseline(t) or len(attrs.retry_history(t)) < MAX_RETRIES


def _was_enqueued(t: FrozenTrial) -> bool:
    return bool(
        attrs.label_of(t)
        or attrs.retry_history(t)
        or attrs.fixed_params(t)
        or attrs.requeued_from(t) is not None
    )


class Recovery:
    """The recovery passes of one controller (``controller_id``) of study ``name``."""

    def __init__(
        self,
        store: Store,
        study: optuna.Study,
        name: str,
        controller_id: int,
        *,
        grace_s: float,
        constraint_names: Sequence[str],
        reap_grace_s: float = 10.0,
    ) -> None:
        self.store, self.study, self.name = store, study, name
        self.fleet: Fleet = store.fleet()
        self.storage: ResilientStorage = store.optuna_storage()
        self.controller_id, self.grace_s = controller_id, grace_s
        self.constraint_names = attrs.constraint_order(constraint_names)
        self.reap_grace_s = reap_grace_s
        self.host = host_name()
        self._stale_lines: list[str] = []
        self.trials: list[FrozenTrial] = []  # as the last sweep left them
        # what this controller recovered, for the run's report (the fault ledger counts it)
        self.retried: list[int] = []

    # -- failing and retrying ----------------------------------------------------------------

    def on_stale(self, study: optuna.Study, t: FrozenTrial) -> None:
        """Optuna's stale-trial callback: Optuna has just failed ``t``."""
        self._stale_lines.append(self._after_fail(t, "its heartbeat stopped"))

    def _after_fail(self, t: FrozenTrial, why: str) -> str:
        self._fail_row(t.number)
        self.fleet.release(self.name, claim_key(t.number), "FAIL")
        retry = self.retry(t)
        then = f"retried as trial {retry}" if retry is not None else "final (already retried)"
        return f"trial {t.number} ({attrs.stage_of(t) or '?'}) failed: {why}; {then}"

    def _fail_row(self, number: int) -> None:
        for row in self.store.trials(self.name, with_levels=False):
            if row.optuna_trial_number == number and row.state != "FAIL" and row.id is not None:
                self.store.update_trial(row.id, state="FAIL")

    def retry(self, t: FrozenTrial) -> int | None:
        """Queue ``t``'s configuration again (once; the baseline until it completes)."""
        trials = self.study.get_trials(deepcopy=False)
        if t.number in successors(trials) or not _may_retry(t):
            return None
        with warnings.catch_warnings():
            # experimental in Optuna 5, and exactly the retry the method needs: the same
            # parameters and attributes, the retry history in system attributes
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            callback = RetryHeartbeatStaleTrialCallback(
                max_retry=None if _is_baseline(t) else MAX_RETRIES
            )
        callback(self.study, attrs.as_enqueued(t))
        new = [u for u in self.study.get_trials(deepcopy=False) if u.number > t.number]
        made = [u.number for u in new if attrs.retry_history(u)[-1:] == [t.number]]
        if made:
            self.retried.append(made[0])
            return made[0]
        return None

    def _requeue(self, t: FrozenTrial) -> None:
        """Put a configuration that never ran back in the queue, its retries untouched."""
        self.study.add_trial(attrs.requeued(t))

    def fail(self, t: FrozenTrial, why: str) -> str | None:
        """RUNNING -> FAIL (one controller wins), then autotune's row, the claim, a retry."""
        try:
            if not self.storage.set_trial_state_values(trial_id(t), TrialState.FAIL):
                return None
        except optuna.exceptions.UpdateFinishedTrialError:
            return None  # another controller finished it first
        return self._after_fail(t, why)

    # -- the passes ------------------------------------------------------------------------

    def _dead(self, owner: ControllerEntry | None) -> str | None:
        """Why the owning controller counts as dead (None: it lives)."""
        if owner is None:
            return "its controller is unknown"
        where = f"{owner.host}:{owner.pid}"
        if owner.state != "running":
            return f"its controller {where} is {owner.state}"
        if owner.host == self.host and not process_alive(
            owner.pid, owner.proc_start, owner.boot_id
        ):
            return f"its controller {where} died"
        if owner.heartbeat_age_s > self.grace_s:
            return f"its controller {where} is silent for {owner.heartbeat_age_s:.0f} s"
        return None

    def _rows(self) -> dict[int, TrialRecord]:
        return {r.optuna_trial_number: r for r in self.store.trials(self.name, with_levels=False)}

    def sweep(self, lk: Locked, *, full: bool = False) -> list[str]:
        """One recovery pass (under the study lock ``lk``); returns what it fixed. The
        study's trials as the pass leaves them are in :attr:`trials`."""
        lines: list[str] = []
        trials = self.study.get_trials(deepcopy=False)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if running:
            claims = {c.trial_number: c for c in lk.claims() if c.trial_number is not None}
            owners = {c.id: c for c in self.fleet.controllers(self.name)}
            rows: dict[int, TrialRecord] | None = None
            for t in running:
                claim = claims.get(t.number)
                if claim is None:
                    rows = rows if rows is not None else self._rows()
                    lines += self._abandoned(t, rows.get(t.number))
                    continue
                why = self._dead(owners.get(claim.controller_id or -1))
                if why is not None:
                    rows = rows if rows is not None else self._rows()
                    lines += self._orphaned(t, rows.get(t.number), why)
        self._stale_lines = []
        with warnings.catch_warnings():
            # experimental in Optuna 5; ask/tell studies must call it themselves
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        lines += self._stale_lines
        if lines:
            trials = self.study.get_trials(deepcopy=False)
        have = successors(trials)
        for t in trials:
            if t.state == TrialState.FAIL and t.number not in have and _may_retry(t):
                retry = self.retry(t)
                if retry is not None:
                    lines.append(f"trial {t.number} had failed without a retry; retried as {retry}")
        if full:
            lines += self.agree()
        self.trials = self.study.get_trials(deepcopy=False) if lines else trials
        return lines

    def _abandoned(self, t: FrozenTrial, row: TrialRecord | None) -> list[str]:
        if row is not None:  # it ran, then lost its claim: a real failure
            line = self.fail(t, "it had no claim")
            return [line] if line else []
        try:
            if not self.storage.set_trial_state_values(trial_id(t), TrialState.FAIL):
                return []
        except optuna.exceptions.UpdateFinishedTrialError:
            return []
        if _was_enqueued(t):
            self._requeue(t)
            return [f"trial {t.number} was abandoned while being claimed; re-queued"]
        return [f"trial {t.number} was abandoned while being claimed (never ran)"]

    def _orphaned(self, t: FrozenTrial, row: TrialRecord | None, why: str) -> list[str]:
        if row is not None and row.state == "COMPLETE" and row.objective is not None:
            self._complete_from(t, row)
            return [f"trial {t.number}: Optuna told the result autotune had stored ({why})"]
        line = self.fail(t, why)
        return [line] if line else []

    def _complete_from(self, t: FrozenTrial, row: TrialRecord) -> None:
        """Tell Optuna a result autotune stored before its controller died."""
        trial = optuna.trial.Trial(self.study, trial_id(t))
        if len(row.constraints) == len(self.constraint_names):
            for key, value in zip(self.constraint_names, row.constraints, strict=True):
                if key not in t.constraints:
                    trial.set_constraint(key, value)
        attrs.write_recovered_summary(trial, row.feasible, row.failure_class, row.capacity_scale)
        assert row.objective is not None
        self.study.tell(t.number, row.objective)
        self.fleet.release(self.name, claim_key(t.number), "COMPLETE")

    def agree(self) -> list[str]:
        """Make autotune's trial states agree with Optuna's (Optuna's FAIL and COMPLETE are
        final; a trial still RUNNING in Optuna is left to its live controller)."""
        states = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        lines: list[str] = []
        for row in self.store.trials(self.name, with_levels=False):
            t = states.get(row.optuna_trial_number)
            if t is None or row.id is None:
                lines.append(f"trial {row.optuna_trial_number} is autotune's only (not in Optuna)")
                continue
            if t.state == TrialState.FAIL and row.state != "FAIL":
                self.store.update_trial(row.id, state="FAIL")
                lines.append(f"trial {row.optuna_trial_number}: {row.state} -> FAIL (as in Optuna)")
            elif t.state == TrialState.COMPLETE and row.state == "RUNNING":
                self.store.update_trial(row.id, state="COMPLETE", objective=t.value)
                lines.append(f"trial {row.optuna_trial_number}: RUNNING -> COMPLETE (as in Optuna)")
        return lines

    def reap_local(self) -> list[str]:
        """Stop what dead controllers on this host left running, and mark them failed: a
        controller row still ``running`` whose process is gone ended without recording how
        (killed, or stopped by a database outage past its tolerance, when it could not
        record anything; docs/faults.md#2-controllers-workers-and-claims)."""
        lines: list[str] = []
        for c in self.fleet.on_host(self.host):
            if c.id != self.controller_id and not process_alive(c.pid, c.proc_start, c.boot_id):
                note = (
                    f"its process ended without recording how; found by controller "
                    f"{self.controller_id}"
                )
                self.fleet.set_state(c.id, "failed", note=note)
                lines.append(f"controller {c.host}:{c.pid} of study {c.study_name!r} had died")
        for w, c in self.fleet.workers_on(self.host):
            if c.id == self.controller_id:
                continue
            if c.state == "running" and process_alive(c.pid, c.proc_start, c.boot_id):
                continue
            killed = stop_group(w.pgid, w.proc_start, w.boot_id, self.reap_grace_s)
            remove_tmpdir(w.tmpdir)
            self.fleet.worker_gone(w.id, "reaped")
            what = f"killed {len(killed)} process(es)" if killed else "already gone"
            lines.append(f"worker group {w.pgid} of {w.trial_name} ({c.study_name!r}): {what}")
        return lines
