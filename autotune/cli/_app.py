"""The typer apps and the output helpers every command module shares.

Errors: library code raises :class:`~autotune.errors.AutotuneError` subclasses with messages
written for users; :func:`autotune.cli.main` turns them into one ``error: ...`` line and the
class's exit status.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from autotune.log import setup_logging

if TYPE_CHECKING:
    pass

__all__ = ["app", "console", "db_app", "print_json", "sim_app", "study_app"]

log = logging.getLogger(__name__)

app = typer.Typer(
    name="autotune",
    help="Tune vLLM engine args with Optuna; ships a simulated vLLM engine.",
    no_args_is_help=True,
    add_completion=False,
)
sim_app = typer.Typer(
    help="The simulated vLLM engine: built-in profiles and single runs.",
    no_args_is_help=True,
)
app.add_typer(sim_app, name="sim")
# the study commands live in two modules (autotune.cli.study, autotune.cli.stored_studies) and
# the database's in a third; their groups are registered here, in the order --help lists them
study_app = typer.Typer(help="Create, run and inspect tuning studies.", no_args_is_help=True)
app.add_typer(study_app, name="study")
db_app = typer.Typer(help="The study database.", no_args_is_help=True)
app.add_typer(db_app, name="db")

# Piped output (files, CI logs, tests) has no terminal width; rich would then wrap tables at
# 80 columns and split long model names across lines. Tables only take the width they need.
# $COLUMNS, when set, wins either way (rich reads it).
_PIPE_WIDTH = 200


def console() -> Console:
    tty = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return Console(width=None if tty else _PIPE_WIDTH)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _print_version(value: bool) -> None:
    if value:
        from autotune import __version__

        print(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print autotune's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    ] = "WARNING",
    log_json: Annotated[bool, typer.Option("--log-json", help="Log JSON lines to stderr.")] = False,
    log_file: Annotated[
        str | None,
        typer.Option("--log-file", help="Also append autotune's log, down to DEBUG, to FILE."),
    ] = None,
) -> None:
    # WARNING by default: stdout is the product; INFO shows vLLM-style startup log lines.
    setup_logging(log_level, json=log_json, file=log_file)
