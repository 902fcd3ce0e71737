"""This process as one controller of a study (docs/faults.md#2-controllers-workers-and-claims).

:meth:`ControllerSession.open` registers the controller (host, pid, start time), turns
Optuna's heartbeat settings on, starts the heartbeat thread, reaps what dead controllers on
this host left behind and reconciles the two stores; the session then records and guards
every worker group (a :class:`~autotune.workers.guard.GroupRegistry`), counts idle time and,
on :meth:`close`, says how the controller ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import optuna

from autotune.config import StudyConfig
from autotune.store import Store
from autotune.store.optuna_ids import trial_id
from autotune.store.resilience import secondary_failure
from autotune.tuning.run.claims import Claimed, Claims, Wait
from autotune.tuning.run.events import OnEvent, Waiting
from autotune.tuning.run.heartbeat import Heartbeat
from autotune.tuning.run.recovery import Recovery
from autotune.tuning.search.space import SpaceBounds
from autotune.workers.guard import GroupRecord, Watchdog, boot_id, host_name, proc_start_ticks

__all__ = ["ControllerSession"]

log = logging.getLogger(__name__)

_FIRST_IDLE_S = 0.2
_MAX_IDLE_S = 2.0


class ControllerSession:
    """One controller's registration, heartbeats, recovery, claims and worker guard."""

    def __init__(
        self,
        store: Store,
        study: optuna.Study,
        cfg: StudyConfig,
        bounds: SpaceBounds,
        *,
        seed_for: Callable[[int], int],
        constraint_names: Sequence[str],
    ) -> None:
        self.store, self.study, self.cfg, self.bounds = store, study, cfg, bounds
        self.name = cfg.name
        self.fleet = store.fleet()
        self.seed_for, self.constraint_names = seed_for, constraint_names
        self.watchdog = Watchdog()
        self.id: int | None = None
        self.heartbeat: Heartbeat | None = None
        self.recovery: Recovery | None = None
        self.claims: Claims | None = None
        self.idle_s = 0.0
        # per trial lane (docs/parallel.md#2-lanes): its backoff, and whether it waits
        self._delay: dict[int, float] = {}
        self._waiting: set[int] = set()
        # lanes are threads: the idle sum and the watchdog's pipe are shared by them
        self._lock = threading.Lock()
        self._workers: dict[int, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> list[str]:
        """Register and recover; returns what the recovery fixed, one line each."""
        c = self.cfg.controller
        self.store.set_outage_tolerance(c.db_outage_tolerance_s)
        cid = self.fleet.register(
            self.name,
            host=host_name(),
            pid=os.getpid(),
            proc_start=proc_start_ticks(os.getpid()),
            boot_id=boot_id(),
        )
        self.id = cid
        storage = self.store.optuna_storage()
        self.recovery = Recovery(
            self.store,
            self.study,
            self.name,
            cid,
            grace_s=c.grace_period_s,
            constraint_names=self.constraint_names,
        )
        storage.configure_heartbeat(
            c.heartbeat_interval_s, c.grace_period_s, self.recovery.on_stale
        )
        self.heartbeat = Heartbeat(self.fleet, cid, storage, c.heartbeat_interval_s).start()
        self.claims = Claims(
            self.store,
            self.study,
            self.name,
            cid,
            strategy=self.cfg.strategy,
            bounds=self.bounds,
            recovery=self.recovery,
            seed_for=self.seed_for,
            on_claim=self.heartbeat.add,
            search=self.cfg.search,
        )
        lines = self.recovery.reap_local()
        lines += self.claims.recover(full=True)
        return lines

    def close(self, state: str, note: str | None = None) -> None:
        """Stop heartbeating and record how this controller ended (best effort: the
        database may be the reason it ends)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.id is not None:
            try:
                self.fleet.set_state(self.id, state, note)
            except Exception as exc:  # the next start marks it failed (recovery.reap_local)
                secondary_failure(log, f"could not record that the controller {state}", exc)
        # heartbeats and outage retries are a run's: off again in between
        self.store.optuna_storage().configure_heartbeat(None, None, None)
        self.store.set_outage_tolerance(0.0)
        self.watchdog.close()

    # -- claims ------------------------------------------------------------------------------

    def claimed(self, c: Claimed) -> None:
        with self._lock:
            self._delay.pop(c.lane, None)
            self._waiting.discard(c.lane)

    def released(self, c: Claimed) -> None:
        if self.heartbeat is not None:
            self.heartbeat.discard(trial_id(c.trial))

    async def idle(self, wait: Wait, emit: OnEvent | None, lane: int = 0) -> None:
        """Wait (with backoff) for running trials (other controllers', other lanes');
        counted as idle. The first lane to wait says why; the others wait silently."""
        with self._lock:
            first = not self._waiting
            self._waiting.add(lane)
            delay = min(
                self._delay.get(lane, _FIRST_IDLE_S),
                _MAX_IDLE_S,
                float(self.cfg.controller.heartbeat_interval_s),
            )
            self._delay[lane] = delay * 1.5
        if first and emit is not None:
            emit(Waiting(wait.reason, wait.running))
        t0 = time.monotonic()
        await asyncio.sleep(delay)
        waited = time.monotonic() - t0
        with self._lock:
            self.idle_s += waited
        if self.id is not None:
            self.fleet.add_idle(self.id, waited)

    # -- the worker guard (GroupRegistry) ----------------------------------------------------

    def spawned(self, group: GroupRecord) -> None:
        with self._lock:
            self.watchdog.spawned(group)
        if self.id is not None:
            self._workers[group.pgid] = self.fleet.add_worker(
                self.id,
                trial_name=group.trial_name,
                host=group.host,
                pgid=group.pgid,
                proc_start=group.proc_start,
                boot_id=group.boot_id,
                tmpdir=group.tmpdir,
            )

    def gone(self, group: GroupRecord) -> None:
        with self._lock:
            self.watchdog.gone(group)
        worker_id = self._workers.pop(group.pgid, None)
        if worker_id is not None:
            self.fleet.worker_gone(worker_id)
