"""Logging set-up for the command line.

Library modules only ever call ``logging.getLogger(__name__)``; handlers, levels and formats
are the application's business, so they are configured here, once, by the CLI.
"""

from __future__ import annotations

import json as _json
import logging
import sys
from typing import TextIO

from rich.console import Console
from rich.logging import RichHandler

from autotune.errors import ConfigError

__all__ = ["setup_logging"]

# Marks the handlers setup_logging installed, so a second call (tests, nested CLIs) replaces
# them instead of stacking duplicates, and leaves handlers that others installed alone.
_OURS = "_autotune_handler"

_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler that looks ``sys.stderr`` up at every record.

    Test runners (pytest's capture, Click's CliRunner) swap ``sys.stderr`` and close the old
    one; a handler holding the stream from set-up time would then write to a closed file.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: for log shippers, not for people."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return _json.dumps(out, ensure_ascii=False)


def _level_number(level: str) -> int:
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        known = ", ".join(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
        raise ConfigError(f"unknown log level {level!r}; use one of {known}")
    return number


def _file_handler(path: str) -> logging.Handler:
    try:
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--log-file {path}: cannot write ({exc.strerror or exc})") from exc
    handler.setFormatter(logging.Formatter(_PLAIN_FORMAT))
    handler.setLevel(logging.DEBUG)
    return handler


def setup_logging(level: str = "INFO", json: bool = False, file: str | None = None) -> None:
    """Send log records to stderr (stdout is the CLI's output): JSON lines with ``json``,
    rich formatting when stderr is a terminal, plain one-line records otherwise. With
    ``file``, autotune's own records down to debug level (the tracebacks behind a warning,
    docs/faults.md#4-database-outages) are appended there too; stderr keeps ``level``."""
    number = _level_number(level)
    handler: logging.Handler
    if json:
        handler = _StderrHandler()
        handler.setFormatter(_JsonFormatter())
    elif sys.stderr.isatty():
        handler = RichHandler(console=Console(stderr=True), show_path=False)
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_PLAIN_FORMAT))
    setattr(handler, _OURS, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(number)
    ours = logging.getLogger("autotune")
    ours.setLevel(logging.NOTSET)
    if file is not None:
        extra = _file_handler(file)
        setattr(extra, _OURS, True)
        handler.setLevel(number)
        root.addHandler(extra)
        # autotune's loggers only: libraries at debug level (SQLAlchemy logs every
        # statement) would bury the file
        ours.setLevel(logging.DEBUG)
