"""The ``autotune`` command line: parse, call the library, print. No logic of its own.

Errors: library code raises :class:`~autotune.errors.AutotuneError` subclasses with messages
written for users; :func:`main` turns them into one ``error: ...`` line and the class's exit
status (1 for most, 4 not found, 5 a service unreachable; 2 is the parser's usage errors).
Anything else is a bug and keeps its traceback. Commands live in one module per command
group (``sim``, ``bench``, ``study`` and ``stored_studies``, ``database`` for ``db``,
``report``/``dashboard``); importing them registers them on ``app``.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence
from typing import Any

import typer

from autotune.cli import bench as _bench  # noqa: F401  (registers ``autotune bench``)
from autotune.cli import calibrate as _calibrate  # noqa: F401  (``autotune calibrate``)
from autotune.cli import database as _database  # noqa: F401  (registers ``autotune db``)
from autotune.cli import nightly as _nightly  # noqa: F401  (``autotune nightly ...``)
from autotune.cli import report as _report  # noqa: F401  (``autotune report``, ``dashboard``)
from autotune.cli import schedule as _schedule  # noqa: F401  (``schedule``, ``scheduler``)
from autotune.cli import serve as _serve  # noqa: F401  (registers ``autotune serve``)
from autotune.cli import sim as _sim  # noqa: F401  (registers ``autotune sim ...``)
from autotune.cli import size as _size  # noqa: F401  (registers ``autotune size``)
from autotune.cli import stored_studies as _stored  # noqa: F401  (``study list/show/...``)
from autotune.cli import study as _study  # noqa: F401  (``autotune study create/run``)
from autotune.cli._app import app
from autotune.errors import AutotuneError
from autotune.inputs import clip

__all__ = ["app", "main"]


# -- entry point --------------------------------------------------------------------------


def _one_line(message: str) -> str:
    # vLLM's pydantic errors span several lines; the CLI promises exactly one, of bounded
    # length (an echoed input may be huge)
    return clip(" ".join(part.strip() for part in message.splitlines() if part.strip()))


# typer >= 0.25 vendors Click (typer._click), older versions use Click itself: take the
# exception classes from typer's own, whichever Click that is.
_CLICK: dict[str, Any] = {c.__name__: c for c in typer.BadParameter.__mro__}
_UsageError: type[Exception] = _CLICK["UsageError"]
_ClickException: type[Exception] = _CLICK["ClickException"]
_NoArgsIsHelp: type[Exception] = getattr(
    sys.modules[_UsageError.__module__], "NoArgsIsHelpError", type("_Never", (Exception,), {})
)


def _usage_line(exc: Any) -> str:
    """A usage error as one line: what is wrong, then where to look."""
    where = exc.ctx.command_path if exc.ctx is not None else "autotune"
    return f"{where}: {_one_line(exc.format_message())} (see `{where} --help`)"


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry: run the app; an AutotuneError becomes one ``error: ...`` line
    and the exit status of its class (docs/usage.md#3-errors-and-exit-codes); a usage error
    (unknown option, bad or missing value) one ``error: ...`` line and exit 2."""
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        # Not standalone: Click raises usage errors here instead of printing a box; typer
        # turns a KeyboardInterrupt inside a command into exit 130 (returned).
        rv = app(args=args, prog_name="autotune", standalone_mode=False)
    except _NoArgsIsHelp as exc:  # `autotune study`: the help, exit 2
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            print(ctx.get_help())
        sys.exit(2)
    except _UsageError as exc:
        print(f"error: {_usage_line(exc)}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    except _ClickException as exc:
        print(f"error: {_one_line(exc.format_message())}", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 1))
    except typer.Abort:
        sys.exit(130)
    except AutotuneError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # outside typer's reach (e.g. during start-up)
        sys.exit(130)
    except OSError as exc:
        # a full disk is the machine's state, not a bug: one line wherever it struck (the
        # study database's own is a StorageError already, autotune.store._engine)
        if exc.errno != errno.ENOSPC:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"error: no space left on the device{where}; free some space", file=sys.stderr)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
