"""SIGTERM and SIGHUP stop a run exactly as Ctrl-C does
(docs/faults.md#1-every-unfinished-trial-is-re-run-once).

asyncio turns Ctrl-C into a cancellation of the run's task, so the running trial unwinds:
its worker group is killed, the trial is failed in both stores and queued again. The same
is done here for SIGTERM (what ``kill``, systemd and container runtimes send) and SIGHUP (a
closed terminal); the run then raises :class:`Interrupted`, whose exit status is
128 + the signal's number, as a shell reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

__all__ = ["STOP_SIGNALS", "Interrupted", "stop_on_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGTERM or SIGHUP (a KeyboardInterrupt: handled as Ctrl-C is)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class _Stop:
    signum: int | None = None

    def signum_now(self) -> int | None:
        return self.signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_Stop]:
    """While inside (in the event loop's thread): a stop signal cancels the current task
    and is remembered in ``.signum``. Outside the main thread nothing is installed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stop = _Stop()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if stop.signum is None and task is not None:
            stop.signum = int(sig)
            task.cancel()

    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (ValueError, RuntimeError, NotImplementedError):
            continue  # not the main thread, or no signals here: Ctrl-C only
        installed.append(sig)
    try:
        yield stop
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
