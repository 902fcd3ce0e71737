"""File reading shared by the loaders, and the one place their errors are worded.

Every problem with a user's file becomes one :class:`ConfigError` whose single-line message
starts ``<file>:<line>:`` and names the field, so a user can jump straight to the bad row.
Rows come back as ``(line_number, dict)`` whatever the format, so the trace parsers validate
JSONL and CSV rows with the same code.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs import special_file

__all__ = ["as_count", "as_number", "bad", "iter_csv", "iter_json_array", "iter_jsonl", "read_text"]


def bad(path: Path | str, line: int | None, field: str | None, message: str) -> ConfigError:
    """A ConfigError for ``path``, ``line`` and ``field``, all on one line."""
    where = f"{path}:{line}" if line is not None else str(path)
    what = f" field '{field}':" if field is not None else ""
    return ConfigError(f"{where}:{what} {message}".replace("\n", " "))


def read_text(path: Path) -> str:
    """The whole file as UTF-8; a missing or unreadable file is a ConfigError, not an OSError.
    Data files may be large, so there is no size cap, but a device or FIFO is refused."""
    if (why := special_file(path)) is not None:
        raise bad(path, None, None, why)
    try:
        return path.read_text(encoding="utf-8-sig")  # tolerate a BOM (Excel exports)
    except FileNotFoundError:
        raise bad(path, None, None, "no such file") from None
    except IsADirectoryError:
        raise bad(path, None, None, "is a directory, not a file") from None
    except UnicodeDecodeError as e:
        raise bad(path, None, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise bad(path, None, None, f"cannot read: {e.strerror}") from None


def _json_error(path: Path, e: json.JSONDecodeError, line_offset: int = 0) -> ConfigError:
    return bad(path, e.lineno + line_offset, None, f"malformed JSON: {e.msg} (column {e.colno})")


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each non-blank line of a JSONL file as ``(line_number, object)``."""
    for number, raw in enumerate(read_text(path).splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _json_error(path, e, number - 1) from None
        if not isinstance(row, dict):
            raise bad(path, number, None, f"expected a JSON object, got {type(row).__name__}")
        yield number, row


def iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level JSON array, each with the line it starts on.

    ``json.load`` would lose the line numbers, and ShareGPT entries need them in errors;
    ``raw_decode`` walks the array one element at a time on the same string instead.
    """
    text = read_text(path)
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    pos, line = 0, 1

    def skip(p: int) -> int:
        while p < len(text) and text[p] in ws:
            p += 1
        return p

    def advance(to: int) -> None:
        nonlocal pos, line
        line += text.count("\n", pos, to)
        pos = to

    advance(skip(0))
    if not text.startswith("[", pos):
        raise bad(path, line, None, "expected a JSON array of conversations")
    advance(skip(pos + 1))
    if text.startswith("]", pos):
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise _json_error(path, e) from None
        yield line, obj
        advance(skip(end))
        if text.startswith(",", pos):
            advance(skip(pos + 1))
        elif text.startswith("]", pos):
            advance(skip(pos + 1))
            if pos < len(text):
                raise bad(path, line, None, "malformed JSON: extra data after the array")
            return
        else:
            raise bad(path, line, None, "malformed JSON: expected ',' or ']' after an entry")


def iter_csv(path: Path, columns: set[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows of a headed CSV file as ``(line_number, {column: text})``, only ``columns`` kept.

    Every requested column must be in the header: a typo in a column mapping fails on
    line 1 instead of producing an empty workload.
    """
    lines = read_text(path).splitlines(keepends=True)
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise bad(path, 1, None, "empty CSV file (no header)") from None
    except csv.Error as e:
        raise bad(path, reader.line_num, None, f"malformed CSV: {e}") from None
    index = {name: i for i, name in enumerate(header)}
    for col in sorted(columns):
        if col not in index:
            raise bad(path, 1, col, f"no such column in the header ({', '.join(header)})")
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise bad(path, reader.line_num, None, f"malformed CSV: {e}") from None
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise bad(
                path,
                reader.line_num,
                None,
                f"malformed CSV: expected {len(header)} fields, got {len(row)}",
            )
        yield reader.line_num, {col: row[index[col]].strip() for col in columns}


def as_number(value: Any, path: Path, line: int, field: str) -> float:
    """A finite number from a JSON value or CSV text."""
    if isinstance(value, bool):
        raise bad(path, line, field, f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            raise bad(path, line, field, f"expected a number, got {value!r}") from None
    else:
        raise bad(path, line, field, f"expected a number, got {value!r}")
    if not math.isfinite(x):
        raise bad(path, line, field, f"expected a finite number, got {value!r}")
    return x


# The longest sequence a token count may describe: vLLM keeps token positions in int32, and
# larger counts overflowed the workload profile's int64 sums (a row with 1e23 tokens).
MAX_TOKENS = 2**31 - 1


def as_count(value: Any, path: Path, line: int, field: str, most: int = MAX_TOKENS) -> int:
    """A non-negative integer of at most ``most`` (token counts): ``12`` and ``"12"`` pass,
    ``1.5``, ``-1`` and ``1e23`` fail."""
    x = as_number(value, path, line, field)
    if x != int(x) or x < 0:
        raise bad(path, line, field, f"expected a non-negative integer, got {value!r}")
    if x > most:
        raise bad(path, line, field, f"{value!r} is more than the {most:,} allowed")
    return int(x)
