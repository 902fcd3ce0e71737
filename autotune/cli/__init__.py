"""The ``autotune`` command line: parse, call the library, print. No logic of its own.

Errors: library code raises :class:`~autotune.errors.AutotuneError` subclasses with messages
written for users; :func:`main` turns them into one ``error: ...`` line and exit status 1.
Anything else is a bug and keeps its traceback. Commands live in one module per command
group (``sim``, ``bench``, ``study``, ``db``); importing them registers them on ``app``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from autotune.cli import bench as _bench  # noqa: F401  (registers ``autotune bench``)
from autotune.cli import sim as _sim  # noqa: F401  (registers ``autotune sim ...``)
from autotune.cli import study as _study  # noqa: F401  (registers ``autotune study/db``)
from autotune.cli._app import app
from autotune.errors import AutotuneError

__all__ = ["app", "main"]


# -- entry point --------------------------------------------------------------------------


def _one_line(message: str) -> str:
    # vLLM's pydantic errors span several lines; the CLI promises exactly one.
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry: run the app; an AutotuneError becomes ``error: ...`` and exit 1."""
    try:
        # Standalone mode: Click prints usage errors itself and exits 2; typer turns a
        # KeyboardInterrupt inside a command into exit 130.
        app(args=list(argv) if argv is not None else None, prog_name="autotune")
    except AutotuneError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # outside typer's reach (e.g. during start-up)
        sys.exit(130)


if __name__ == "__main__":
    main()
