"""One server process and everything it spawns, from launch to "no process left".

Modelled on vLLM's ``bench sweep`` server handling: the server runs as the leader of its own
session and process group (vLLM forks an EngineCore, workers and a resource tracker, and a
crashed API server can leave them behind), readiness polls ``/health`` against a monotonic
deadline and stops early when the process dies, and cleanup signals the whole group, even
when the leader has already exited, and returns only once the group is empty, so the next
trial never meets the previous one's memory or port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from autotune.errors import AutotuneError, ConfigError, WorkerStartupError
from autotune.failures import FailureClass, FailureMatch
from autotune.redact import mask_argv
from autotune.store.resilience import secondary_failure
from autotune.workers.cause import death_class, signal_name
from autotune.workers.guard import (
    GroupRecord,
    GroupRegistry,
    boot_id,
    guarded_argv,
    host_name,
    proc_start_ticks,
)
from autotune.workers.logs import classify_worker_log, log_tail
from autotune.workers.reaping import become_subreaper, group_gone, member_states, signal_group
from autotune.workers.watch import DeathWatch, ProcInfo, describe_status, snapshot_group

__all__ = ["ProcessSupervisor", "WorkerLaunchError"]

log = logging.getLogger(__name__)

# Seconds one /health probe may take; longer means "not ready yet", not "failed".
_POLL_TIMEOUT_S = 2.0
_POLL_MAX_INTERVAL_S = 0.5
# After SIGKILL a process only lingers in uninterruptible sleep (e.g. a GPU driver call).
_KILL_WAIT_S = 30.0


class WorkerLaunchError(WorkerStartupError):
    """A :class:`WorkerStartupError` with what the caller needs to record the failure.

    The extra fields are attributes set after construction, so the constructor stays the one
    of :class:`WorkerStartupError` and code that only knows that type keeps working.
    """

    log_tail: str = ""
    elapsed_s: float = 0.0
    # set when /health had answered before the failure (a failed smoke request): the trial
    # stores what the start-up already established
    startup_s: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    estimated_max_model_len: int | None = None
    returncode: int | None = None
    log_path: Path | None = None


class ProcessSupervisor:
    """Launch ``argv`` in its own process group, wait for ``/health``, kill the group.

    One-shot: ``start`` once, ``stop`` any number of times. Output (stdout and stderr) goes
    to ``log_path``, which is truncated at launch. The process is launched through the
    death-signal wrapper and, with a ``registry``, reported right after launch and once
    its group is gone (:mod:`autotune.workers.guard`); ``tmpdir`` and ``trial_name`` are
    recorded with it.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        log_path: Path,
        health_url: str,
        startup_timeout_s: float,
        grace_s: float = 10.0,
        cwd: Path | None = None,
        registry: GroupRegistry | None = None,
        trial_name: str = "",
        tmpdir: Path | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must not be empty")
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        self.health_url = health_url
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.cwd = cwd
        self.registry = registry
        self.trial_name = trial_name
        self.tmpdir = tmpdir
        self._group: GroupRecord | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._gone_at: float | None = None
        self._stopped = False
        self._died_before_stop = False
        self._lock = asyncio.Lock()
        # the group's members when /health first answered 200 (see autotune.workers.watch)
        self.members_at_ready: dict[int, ProcInfo] = {}

    # -- state ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The leader's pid, which is also the process-group id (None before start)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def elapsed_s(self) -> float:
        """Seconds since launch (0 before start)."""
        return time.monotonic() - self._started_at if self._proc is not None else 0.0

    @property
    def lifetime_s(self) -> float | None:
        """Seconds from launch to the group's end (so far, while it runs); None before
        start. What the worker cost is counted from this (docs/cost.md#1-what-is-counted)."""
        if self._proc is None:
            return None
        end = self._gone_at if self._gone_at is not None else time.monotonic()
        return end - self._started_at

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` has emptied the group."""
        return self._stopped

    @property
    def died_before_stop(self) -> bool:
        """True when the leader had exited on its own before :meth:`stop` was called."""
        return self._died_before_stop

    def alive(self) -> bool:
        """Whether the leader runs. Its children are not checked: vLLM's API server exits
        when its engine dies, and ``stop`` deals with any that remain."""
        return self._proc is not None and self._proc.poll() is None

    def watch(self) -> DeathWatch:
        """A :class:`~autotune.workers.watch.DeathWatch` of this started server (run its
        ``run()`` as a task while the server is in use, cancel it before :meth:`stop`)."""
        if self._proc is None:
            raise RuntimeError("start() first")
        return DeathWatch(
            self._proc,
            self.members_at_ready,
            health_url=self.health_url,
            log_path=self.log_path,
        )

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []

    # -- start ---------------------------------------------------------------------------

    async def start(self) -> float:
        """Launch and wait until ``health_url`` answers 200. Returns seconds to ready.

        Raises :class:`WorkerLaunchError`: the log's failure class when the process exits
        first, ``STARTUP_TIMEOUT`` at the deadline; in both cases the group is gone by then.
        :class:`~autotune.errors.ConfigError` when ``argv`` cannot be executed at all.
        """
        if self._proc is not None:
            raise RuntimeError("ProcessSupervisor is one-shot: start() was already called")
        become_subreaper()
        self._check_executable()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            # The child holds its own copy of the descriptor, so ours can close at once.
            try:
                self._proc = subprocess.Popen(
                    guarded_argv(self.argv),
                    env=self.env,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:  # no such executable: a set-up error, not a trial's
                raise ConfigError(f"cannot launch {self.argv[0]!r}: {exc}") from exc
        self._started_at = time.monotonic()
        log.debug("started pid %d: %s", self._proc.pid, mask_argv(self.argv))
        try:
            self._register()
            return await self._wait_ready(self._started_at + self.startup_timeout_s)
        except BaseException:
            await self.stop()  # also on cancellation: never leave a half-started server
            raise

    def _check_executable(self) -> None:
        """A program that cannot be found is a set-up error, not a trial's (the wrapper
        would only report it as an exit code)."""
        prog = self.argv[0]
        path = (self.env or os.environ).get("PATH", os.defpath)
        found = (
            os.access(prog, os.X_OK) and os.path.isfile(prog)
            if os.sep in prog
            else shutil.which(prog, path=path) is not None
        )
        if not found:
            raise ConfigError(f"cannot launch {prog!r}: no such executable")

    def _register(self) -> None:
        assert self._proc is not None
        self._group = GroupRecord(
            trial_name=self.trial_name,
            pgid=self._proc.pid,
            proc_start=proc_start_ticks(self._proc.pid),
            boot_id=boot_id(),
            host=host_name(),
            tmpdir=str(self.tmpdir) if self.tmpdir is not None else None,
        )
        if self.registry is not None:
            self.registry.spawned(self._group)

    async def _wait_ready(self, deadline: float) -> float:
        proc = self._proc
        assert proc is not None
        interval = 0.05
        async with aiohttp.ClientSession() as session:
            while True:
                if proc.poll() is not None:
                    raise await self._failure(None)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise await self._failure(FailureClass.STARTUP_TIMEOUT)
                if await self._probe(session, min(_POLL_TIMEOUT_S, remaining)):
                    # A 200 from someone else's server on our port would look like success;
                    # ours would die on the bind, so insist that it still runs.
                    if proc.poll() is None:
                        # who is in the group now: any of them exiting later is a death
                        self.members_at_ready = snapshot_group(proc.pid)
                        return time.monotonic() - self._started_at
                    continue
                await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
                interval = min(interval * 2, _POLL_MAX_INTERVAL_S)

    async def _probe(self, session: aiohttp.ClientSession, timeout_s: float) -> bool:
        try:
            async with session.get(
                self.health_url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _failure(self, forced: FailureClass | None) -> WorkerLaunchError:
        """Kill what is left, then build the error from the complete log."""
        elapsed = time.monotonic() - self._started_at
        rc = self.returncode
        await self.stop()  # grandchildren may still be writing; read the log after
        lines = self.log_lines()
        match = classify_worker_log(lines)
        if forced is FailureClass.STARTUP_TIMEOUT:
            message = (
                f"no 200 from {self.health_url} within {self.startup_timeout_s:g} s; "
                f"process group killed"
            )
            match = FailureMatch(forced, match.line, match.estimated_max_model_len)
        else:
            # a signal from outside with nothing in the log is KILLED, not UNKNOWN: the
            # configuration runs again (autotune/workers/cause.py)
            found = None if match.failure_class is FailureClass.UNKNOWN else match
            cls = death_class(signal=signal_name(rc), hung=False, log=found, started=False)
            match = FailureMatch(cls, match.line, match.estimated_max_model_len)
            message = f"worker {describe_status(rc)[0]} after {elapsed:.1f} s"
            if match.line:
                message += f": {match.line}"
        err = WorkerLaunchError(message, match.failure_class)
        err.log_tail = log_tail(lines, cause=match.line or None)
        err.elapsed_s = elapsed
        err.estimated_max_model_len = match.estimated_max_model_len
        err.returncode = rc
        err.log_path = self.log_path
        return err

    # -- stop ----------------------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, return when no member is left.

        Safe to call twice, before start, and after the leader exited (its orphans are
        still in the group and still killed). Raises :class:`AutotuneError` only when
        processes survive SIGKILL, so that no next trial starts beside them.
        """
        async with self._lock:
            proc = self._proc
            if proc is None or self._stopped:
                return
            if not self._died_before_stop and proc.poll() is not None:
                self._died_before_stop = True
            pgid = proc.pid
            if not group_gone(proc):
                signal_group(pgid, signal.SIGTERM)
                # a stopped (SIGSTOP) process acts on SIGTERM only once continued; without
                # this a frozen worker would wait out the grace period for SIGKILL
                signal_group(pgid, signal.SIGCONT)
                if not await self._wait_gone(proc, self.grace_s):
                    log.warning(
                        "process group %d ignored SIGTERM for %g s; sending SIGKILL",
                        pgid,
                        self.grace_s,
                    )
                    signal_group(pgid, signal.SIGKILL)
                    if not await self._wait_gone(proc, _KILL_WAIT_S):
                        raise AutotuneError(
                            f"process group {pgid} still has members {_KILL_WAIT_S:g} s after "
                            f"SIGKILL: {member_states(pgid)}"
                        )
            proc.wait()  # already exited; reaps it if group_gone has not
            self._stopped = True
            self._gone_at = time.monotonic()
            if self.registry is not None and self._group is not None:
                try:
                    self.registry.gone(self._group)
                except Exception as exc:  # the group is gone: a failed record must not hide that
                    secondary_failure(log, f"recording that worker group {pgid} is gone", exc)

    @staticmethod
    async def _wait_gone(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not group_gone(proc):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
