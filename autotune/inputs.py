"""Limits on what autotune reads from its users (docs/bad-input.md).

One module owns them, so the CLI, the study and nightly configs, the service and the
database layer refuse the same inputs with the same words:

- a config file must be a regular file (``/dev/zero`` or a FIFO would never end) of at most
  :data:`MAX_CONFIG_BYTES` unless the caller allows more;
- a YAML document may not use anchors and aliases (``&a`` / ``*a``): the value tree is built
  from the node graph, and nine levels of aliases expand 900 bytes into gigabytes. Depth and
  node count are capped too, so a megabyte of ``[[[[`` or ``1,1,1,...`` stays cheap;
- a URL (database, base URL, Prometheus) is stripped of surrounding whitespace and may not
  hold control characters (a trailing newline once named a new SQLite file);
- a number in a config is finite, a count is not a boolean, and an integer fits a 64-bit
  database column (:func:`check_number`).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError

__all__ = [
    "INT64_MAX",
    "MAX_CONFIG_BYTES",
    "MAX_ERROR_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "check_number",
    "check_text",
    "check_yaml",
    "clean_url",
    "clip",
    "read_regular_file",
    "special_file",
]

# A study config is a few kilobytes; the largest legitimate one (a long enqueue list) stays
# far below a megabyte. `study create --max-config-bytes` allows more.
MAX_CONFIG_BYTES = 1024 * 1024
# Nesting a config needs: section -> field -> list -> mapping is four; 64 leaves room.
MAX_YAML_DEPTH = 64
# Values in one document (scalars, lists, mappings); a big enqueue list is a few thousand.
MAX_YAML_NODES = 100_000
# Integers are stored in BIGINT columns and handed to numpy as int64.
INT64_MAX = 2**63 - 1
# The longest error line printed or answered: a 200 KB model name was echoed whole.
MAX_ERROR_CHARS = 2000


def clip(message: str) -> str:
    """``message`` cut to :data:`MAX_ERROR_CHARS`, saying how long it was."""
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return f"{message[: MAX_ERROR_CHARS - 60]}... (cut; {len(message):,} characters in all)"


def read_regular_file(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, refusing (ConfigError) anything that is not a regular file
    and any file longer than ``max_bytes``. Opened non-blocking: opening a FIFO would
    otherwise wait for a writer forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: cannot read {what} (it is a folder, not a file)")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: cannot read {what} ({_SPECIAL})")
        if st.st_size > max_bytes:
            raise ConfigError(_too_big(path, what, st.st_size, max_bytes))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # a file that grew since fstat is still capped
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(_too_big(path, what, len(data), max_bytes))
    return data


_SPECIAL = "it is not a regular file: a device, pipe or socket never ends"


def special_file(path: Path) -> str | None:
    """Why ``path`` must not be read whole (a device, FIFO or socket: ``/dev/zero`` never
    ends, a FIFO blocks), or None for a regular file, a folder or a missing path (which the
    caller reports in its own words)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _SPECIAL


def _too_big(path: Path, what: str, size: int, max_bytes: int) -> str:
    return (
        f"{path}: {what} is {size:,} bytes, more than the {max_bytes:,} allowed "
        "(a study config is a few kilobytes; --max-config-bytes allows more)"
    )


def check_yaml(text: str, source: str, *, lines: bool = True) -> None:
    """Refuse, before any value is built, a YAML document with anchors or aliases, deeper
    than :data:`MAX_YAML_DEPTH` or with more than :data:`MAX_YAML_NODES` values. Reads the
    parser's events, so the cost is linear in the text whatever it holds. Syntax errors
    are left to the composer, which reports them with their line. ``lines=False``: the
    messages name ``source`` alone (a value inside a document, already ``file:line``)."""
    depth = nodes = 0
    prev: yaml.Event | None = None
    anchor: tuple[str, str] | None = None
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            mark = event.start_mark
            at = f"{source}:{mark.line + 1}" if lines and mark is not None else source
            if isinstance(event, yaml.AliasEvent):
                if isinstance(prev, yaml.ScalarEvent) and prev.value == "<<" and prev.implicit[0]:
                    raise ConfigError(
                        f"{at}: YAML merge keys (<<) are not supported; write the fields out"
                    )
                raise ConfigError(
                    f"{at}: YAML aliases (*{event.anchor}) are not supported; write the value out"
                )
            if isinstance(event, yaml.NodeEvent) and event.anchor is not None and not anchor:
                anchor = (event.anchor, at)  # refused at the end, or at its first alias
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_YAML_NODES:
                    raise ConfigError(
                        f"{at}: the document holds more than {MAX_YAML_NODES:,} "
                        "values; a study config needs far fewer"
                    )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError(
                        f"{at}: the document nests deeper than {MAX_YAML_DEPTH} levels"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            prev = event
    except yaml.YAMLError:
        return  # the composer reports the syntax error with its line
    if anchor is not None:
        raise ConfigError(
            f"{anchor[1]}: YAML anchors (&{anchor[0]}) are not supported; "
            "write the value out where it is used"
        )


def clean_url(value: str) -> str:
    """``value`` without surrounding whitespace; ValueError (whose text never echoes the
    URL, which may hold a password) if it is empty or holds a control character."""
    url = value.strip()
    if not url:
        raise ValueError("is empty; give a URL")
    bad = next((c for c in url if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"holds a control character ({bad!r}); write the URL on one line")
    return url


def check_number(value: Any, annotation: Any) -> None:
    """ValueError for a value pydantic would silently coerce into a numeric field whose
    ``annotation`` (e.g. ``int | None``) has no bool: a boolean (``n_trials: true`` would run
    1 trial), an integer beyond 64 bits, or (items of ``list[int]``) any of these."""
    kinds = _kinds(annotation)
    if bool in kinds or not kinds & {int, float}:
        return
    if isinstance(value, bool):
        raise ValueError(f"Input should be a number, not the boolean {str(value).lower()}")
    if int in kinds and isinstance(value, int) and abs(value) > INT64_MAX:
        raise ValueError(f"Input should be at most {INT64_MAX:,} in absolute value (64 bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("Input should be a finite number")
    if list in kinds and isinstance(value, list):
        for item in value:
            check_number(item, int if int in kinds else float)


def check_text(value: Any) -> None:
    """ValueError if a string in ``value`` (or in its lists and mappings) holds a NUL
    character: YAML's "\\0" escape makes one, and paths and argv cannot carry it."""
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("a value may not contain a NUL character (\\0)")
    elif isinstance(value, list):
        for item in value:
            check_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key)
            check_text(item)


def _kinds(annotation: Any) -> set[Any]:
    """The plain types inside ``annotation`` (``int | None`` -> {int, NoneType};
    ``list[int] | None`` -> {list, int, NoneType})."""
    from typing import get_args, get_origin

    origin = get_origin(annotation)
    if origin is None:
        return {annotation}
    out: set[Any] = {origin} if isinstance(origin, type) else set()
    for arg in get_args(annotation):
        out |= _kinds(arg)
    return out
