"""Two tiny helpers run as scripts (``python -I -S _reaper.py ...``), with the standard
library only, so they start in milliseconds and never import autotune
(docs/faults.md#3-no-orphaned-workers); the watchdog reads ``/proc`` through ``procstat.py``
beside it, which is standard library only too.

``exec PARENT_PID -- ARGV...``: the worker launch wrapper. It asks the kernel to send it
SIGTERM when its parent thread dies (``PR_SET_PDEATHSIG``; set here rather than in a
``preexec_fn``, which is unsafe once the controller runs threads), checks that the parent
did not die before that, restores the signal dispositions Python changed, then ``execvp``s
the worker, which keeps the setting.

``watch GRACE_S``: the controller's watchdog. It reads ``+ PGID START_TICKS TMPDIR`` and
``- PGID`` lines on stdin; when stdin reaches end of file (the controller exited, however it
died) it stops every group still registered: SIGTERM, SIGKILL after ``GRACE_S``, each group
first checked by its leader's start time so a reused process-group id is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

__all__: list[str] = []

TYPE_CHECKING = False  # typing's own costs an import at every worker launch
if TYPE_CHECKING:
    from autotune.workers.procstat import group_members, read_stat
elif __name__ == "__main__":
    # -I leaves this script's folder off sys.path; the /proc reader beside it is stdlib-only
    # (appended, so it never shadows a standard module)
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from procstat import group_members, read_stat

_PR_SET_PDEATHSIG = 1


def _exec(argv: list[str]) -> None:
    parent, args = int(argv[0]), argv[2:]  # argv[1] is "--"
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the controller died before the setting took effect
            os._exit(1)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; a worker must not
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"cannot launch {args[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


def _stop_group(pgid: int, start: int, grace_s: float) -> None:
    leader = read_stat(pgid)
    if leader is not None and leader.start_ticks != start:
        return  # the id now belongs to another process: not ours
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid, start):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(pgid, start) and time.monotonic() < deadline:
            time.sleep(0.05)


def _watch(argv: list[str]) -> None:
    grace_s = float(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: dict[int, tuple[int, str]] = {}
    for line in sys.stdin:
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[0] == "+":
            groups[int(parts[1])] = (int(parts[2]), parts[3].rstrip("\n"))
        elif len(parts) == 2 and parts[0] == "-":
            groups.pop(int(parts[1]), None)
    for pgid, (start, tmpdir) in groups.items():
        _stop_group(pgid, start, grace_s)
        if tmpdir != "-":
            shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "exec":
        _exec(sys.argv[2:])
    elif sys.argv[1] == "watch":
        _watch(sys.argv[2:])
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
