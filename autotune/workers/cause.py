"""Whose doing a worker's death is: the configuration's, or something outside it
(docs/vllm.md#10-whose-death-is-it).

A death counts against the configuration when the worker shows it caused it: an
out-of-memory line in its log (even when the kernel's OOM killer sent the SIGKILL), an
engine error, an exit of its own (an exit code, or a crash signal such as SIGSEGV or the
SIGILL of docs/vllm-cpu.md), or a death that repeats when the configuration is run again.
It does not when a signal came from outside (SIGKILL from a neighbour's OOM killer or a
preempted spot node, SIGTERM, SIGINT, SIGHUP, SIGQUIT) or the worker hung (stopped by SIGSTOP,
stuck in uninterruptible sleep): those are ``KILLED`` and ``HUNG``, and the trial runs once
more in a fresh worker (docs/faults.md#10-worker-faults), whose result is the verdict.
"""

from __future__ import annotations

import signal

from autotune.failures import FailureClass, FailureMatch

__all__ = ["EXTERNAL_SIGNALS", "RETRYABLE", "death_class", "signal_name"]

# signals a process gets from someone else; every other fatal signal is a crash of its own
EXTERNAL_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
# the classes whose first occurrence is retried rather than taken as the verdict
RETRYABLE = frozenset({FailureClass.KILLED, FailureClass.HUNG})
_RUNTIME = (FailureClass.RUNTIME_OOM, FailureClass.ENGINE_DEAD)


def signal_name(returncode: int | None) -> str | None:
    """``"SIGKILL"`` for a Popen return code of -9; None for an exit or an unknown status."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def death_class(
    *, signal: str | None, hung: bool, log: FailureMatch | None, started: bool = True
) -> FailureClass:
    """The class of a death: ``signal`` ended a process of the worker (None: it exited, or
    its status is unknown), ``hung``: it stopped making progress, ``log``: what the log
    classifier found. ``started``: /health had answered 200 (a runtime death; else a death
    during start-up, whose log class stands, ``UNKNOWN`` when the log says nothing)."""
    if log is not None and log.failure_class is FailureClass.RUNTIME_OOM:
        return FailureClass.RUNTIME_OOM
    if hung:
        return FailureClass.HUNG
    if not started and log is not None:
        return log.failure_class  # a start-up failure the log names (KV too small, ...)
    if signal in EXTERNAL_SIGNALS:
        # at run time the log's EngineDeadError is the consequence of the kill
        # (docs/vllm.md#9-worker-death), not a cause
        return FailureClass.KILLED
    if not started:
        return FailureClass.UNKNOWN
    if log is not None and log.failure_class in _RUNTIME:
        return log.failure_class
    return FailureClass.ENGINE_DEAD
