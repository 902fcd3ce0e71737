"""``autotune scheduler``: runs the stored schedules (docs/nightly.md#8-the-scheduler).

Schedules live in ``autotune_schedules``; each names a cron expression (UTC unless its
timezone says otherwise) and a nightly config. A tick runs every schedule whose latest fire
time at or before now has not run yet, recording that fire time *before* the run starts, so
a scheduler restarted at any moment never runs one fire time twice. A scheduler that was
down over several fire times finds only the latest one due: one catch-up run, never a
burst. A schedule never fires for times before it was added. Exactly one scheduler is
active per database (a held lock, :mod:`autotune.nightly.job_lock`). The clock, the sleep and
the job runner are injectable.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from autotune.errors import ConfigError
from autotune.nightly.job_lock import held_lock
from autotune.nightly.job_records import ScheduleRecord, schedules, update_schedule
from autotune.store import Store
from autotune.store.db import ENV_VAR

__all__ = [
    "Clock",
    "Fired",
    "JobRunner",
    "Scheduler",
    "check_cron",
    "check_timezone",
    "due_fire",
    "next_fire",
    "subprocess_runner",
]

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
JobRunner = Callable[[ScheduleRecord], int]
_BUSY = (
    "another autotune scheduler is active on this database (it holds the scheduler lock); "
    "exactly one runs the schedules"
)


def check_cron(expr: str) -> str:
    if not croniter.is_valid(expr):
        raise ConfigError(f"--cron: {expr!r} is not a cron expression (e.g. '0 2 * * *')")
    return expr


def check_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        msg = f"--timezone: {name!r} is not a time zone (e.g. UTC, Europe/Paris)"
        raise ConfigError(msg) from None


def _latest_at_or_before(expr: str, tz: str, now: datetime) -> datetime:
    local = now.astimezone(check_timezone(tz)) + timedelta(microseconds=1)
    prev: datetime = croniter(expr, local).get_prev(datetime)
    return prev.astimezone(UTC)


def next_fire(expr: str, tz: str, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (UTC)."""
    nxt: datetime = croniter(expr, after.astimezone(check_timezone(tz))).get_next(datetime)
    return nxt.astimezone(UTC)


def due_fire(s: ScheduleRecord, now: datetime) -> datetime | None:
    """The fire time ``s`` should run for at ``now``: the latest one at or before now, if it
    has not run and is not older than the schedule; else None."""
    fire = _latest_at_or_before(s.cron, s.timezone, now)
    if s.last_fire_at is not None and fire <= s.last_fire_at:
        return None
    if fire < s.created_at:
        return None
    return fire


def subprocess_runner(url: str) -> JobRunner:
    """Run ``autotune nightly --config FILE`` as a child process (the database URL in its
    environment, never in argv) and return its exit status."""

    def run(s: ScheduleRecord) -> int:
        env = {**os.environ, ENV_VAR: url}
        argv = [sys.executable, "-m", "autotune.cli", "nightly", "--config", s.config_path]
        return subprocess.run(argv, env=env, check=False).returncode

    return run


@dataclass(frozen=True)
class Fired:
    name: str
    fire_at: datetime
    exit_code: int


class Scheduler:
    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        run: JobRunner | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock or (lambda: datetime.now(UTC))
        self.run = run or subprocess_runner(store.url)
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait

    def tick(self) -> list[Fired]:
        """Run what is due now, one job at a time."""
        out = []
        for s in schedules(self.store):
            now = self.clock()
            fire = due_fire(s, now)
            if fire is None:
                continue
            # recorded before the run: a crash or restart never runs this fire time again
            update_schedule(
                self.store, s.name, last_fire_at=fire, last_started_at=now, last_exit_code=None
            )
            log.info("schedule %s: running the %s fire time", s.name, fire.isoformat())
            code = self.run(s)
            update_schedule(self.store, s.name, last_exit_code=code)
            out.append(Fired(s.name, fire, code))
        return out

    def seconds_to_next(self, cap: float = 60.0) -> float:
        """Until the next fire time of any schedule (at most ``cap``: new schedules are
        picked up within that)."""
        now = self.clock()
        nexts = [next_fire(s.cron, s.timezone, now) for s in schedules(self.store)]
        if not nexts:
            return cap
        return max(0.0, min(cap, min((n - now).total_seconds() for n in nexts)))

    def stop(self) -> None:
        self._stop.set()

    def serve(self, *, once: bool = False, on_hold: Callable[[], None] | None = None) -> None:
        """Hold the scheduler lock and tick until :meth:`stop` (or once); ``on_hold`` is
        called once the lock is held (the CLI says so: a service that prints nothing cannot
        be told from one still starting)."""
        with held_lock(self.store, "scheduler", _BUSY):
            if on_hold is not None:
                on_hold()
            while not self._stop.is_set():
                self.tick()
                if once:
                    return
                self.sleep(self.seconds_to_next() + 0.5)
