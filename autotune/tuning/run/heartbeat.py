"""Heartbeats for a controller and its running trials, sent from a thread
(docs/faults.md#1-every-unfinished-trial-is-re-run-once).

Optuna's own heartbeat runs only inside ``study.optimize``; autotune asks and tells, and the
in-process simulator blocks the event loop for seconds, so a thread beats instead: every
``interval_s`` it records the controller's heartbeat (autotune's table) and each running
trial's (Optuna's, which ``fail_stale_trials`` reads). A beat that fails (the database is
restarting) is retried every half second; it never raises, since the run itself notices an
outage on its next database call.
"""

from __future__ import annotations

import logging
import threading
import time

from autotune.store.fleet import Fleet
from autotune.store.optuna_storage import ResilientStorage

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)

_RETRY_S = 0.5


class Heartbeat:
    """``start()`` once, ``add``/``discard`` trial ids as trials start and end, ``stop()``."""

    def __init__(
        self, fleet: Fleet, controller_id: int, storage: ResilientStorage, interval_s: float
    ) -> None:
        self.fleet, self.controller_id = fleet, controller_id
        self.storage, self.interval_s = storage, interval_s
        self._trials: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0
        self.failed_beats = 0
        self.last_ok = time.monotonic()

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(
            target=self._run, name=f"autotune-heartbeat-{self.controller_id}", daemon=True
        )
        self._thread.start()
        return self

    def add(self, trial_id: int) -> None:
        with self._lock:
            self._trials.add(trial_id)

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self._trials.discard(trial_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def beat(self) -> bool:
        """One beat now; False when the database did not take it."""
        with self._lock:
            trials = sorted(self._trials)
        try:
            self.fleet.beat(self.controller_id)
            for trial_id in trials:
                # the inner storage: no retries here, the next beat comes soon enough
                self.storage.inner.record_heartbeat(trial_id)
        except Exception as exc:  # an outage: keep beating, the run decides when to give up
            self.failed_beats += 1
            log.debug("heartbeat failed: %s", exc)
            return False
        self.beats += 1
        self.last_ok = time.monotonic()
        return True

    def _run(self) -> None:
        try:
            wait = self.interval_s
            while not self._stop.wait(wait):
                wait = self.interval_s if self.beat() else _RETRY_S
        finally:
            # Optuna's sessions are per thread: this one's must be closed by this thread
            self.storage.remove_session()
