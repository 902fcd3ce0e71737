"""Timed traces: Mooncake JSONL, Azure LLM inference CSV, and any CSV/JSONL by column mapping.

All three go through one row model (timestamp, input and output length, optional hash ids
or prompt text) and one builder, so validation and error wording are the same everywhere:
a missing file, a malformed line, an unknown column, a negative or out-of-order timestamp
each give one ConfigError naming the file, the line and the field.

Timestamps are made relative to the first row (a trace excerpt starting at 3600 s should
not idle for an hour), then stretched by :func:`.arrivals.scale_trace`. Datetimes (Azure)
are kept as integer nanoseconds until then: as float epoch seconds they would lose the
trace's 7th fractional digit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

from autotune.errors import ConfigError
from autotune.inputs import INT64_MAX
from autotune.workload._io import as_count, as_number, bad, iter_csv, iter_jsonl
from autotune.workload.arrivals import scale_trace
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import (
    DEFAULT_VOCAB_SIZE,
    MOONCAKE_BLOCK_SIZE,
    HashBlockTokens,
    TokenCounter,
    approx_token_count,
)

__all__ = ["TRACE_FIELDS", "dropped_text", "load_azure", "load_mooncake", "load_trace"]

# The fields a column mapping may name, mapped from the file's own column names.
TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "prompt")

_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?Z?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class _Options:
    """What the caller asked for, passed down in one piece."""

    time_scale: float
    rate_scale: float
    max_requests: int | None
    block_size: int
    vocab_size: int
    seed: int
    prefix: str
    count_tokens: TokenCounter


class _Clock:
    """Turns timestamp cells into seconds since the first row, checking order as it goes.

    Numbers are multiplied by ``unit`` (seconds per trace unit); datetime strings (taken
    as UTC) become integer ns first. A file must use one form throughout.
    """

    def __init__(self, path: Path, field: str, unit: float) -> None:
        self.path, self.field, self.unit = path, field, unit
        self.origin: int | float | None = None
        self.prev: tuple[float, int] | None = None  # (seconds, line)

    def _datetime_ns(self, text: str, line: int) -> int:
        m = _DATETIME.fullmatch(text)
        if m is None:
            raise bad(
                self.path,
                line,
                self.field,
                f"expected a number or 'YYYY-MM-DD HH:MM:SS[.fffffff]', got {text!r}",
            )
        try:
            whole = datetime.fromisoformat(f"{m[1]}T{m[2]}").replace(tzinfo=UTC)
        except ValueError as e:
            raise bad(self.path, line, self.field, f"invalid date/time {text!r}: {e}") from None
        delta = whole - _EPOCH
        frac = (m[3] or "").ljust(9, "0")
        return (delta.days * 86400 + delta.seconds) * 10**9 + int(frac)

    def seconds(self, value: Any, line: int) -> float:
        is_text_time = isinstance(value, str) and not _is_number(value)
        raw: int | float
        if is_text_time:
            raw = self._datetime_ns(value.strip(), line)
        else:
            raw = as_number(value, self.path, line, self.field) * self.unit
            if raw < 0:
                raise bad(self.path, line, self.field, f"negative timestamp {value!r}")
            if raw == float("inf"):  # finite in the file, beyond a float once in seconds
                raise bad(self.path, line, self.field, f"timestamp {value!r} is out of range")
        if self.origin is None:
            self.origin = raw
        elif isinstance(raw, int) != isinstance(self.origin, int):
            raise bad(
                self.path,
                line,
                self.field,
                "mixes date/time strings and numbers; use one form throughout",
            )
        t = (raw - self.origin) / 1e9 if isinstance(raw, int) else raw - self.origin
        if self.prev is not None and t < self.prev[0]:
            raise bad(
                self.path,
                line,
                self.field,
                f"{value!r} is earlier than line {self.prev[1]}; the trace must be sorted by time",
            )
        self.prev = (t, line)
        return t


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _hash_ids(value: Any, path: Path, line: int, field: str) -> list[int]:
    """A JSON list of ints, or (CSV) the same as text: "[1, 2]" or "1 2" or "1;2"."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else re.split(r"[\s;,]+", text)
        except json.JSONDecodeError as e:
            raise bad(path, line, field, f"malformed list: {e.msg}") from None
        value = [v for v in value if v != ""]
    if not isinstance(value, list):
        raise bad(path, line, field, f"expected a list of block hash ids, got {value!r}")
    return [as_count(v, path, line, field, INT64_MAX) for v in value]


def _cell(
    path: Path, line: int, row: Mapping[str, Any], columns: Mapping[str, str], field: str
) -> Any:
    """The row's value for ``field``, through the column mapping."""
    column = columns[field]
    if column not in row:
        raise bad(path, line, column, "missing")
    return row[column]


def _build(
    path: Path,
    rows: Iterator[tuple[int, Mapping[str, Any]]],
    columns: Mapping[str, str],
    clock: _Clock | None,
    opts: _Options,
    kind: str,
) -> Workload:
    """Validate ``rows`` (file column names per ``columns``) and make the workload."""
    blocks = HashBlockTokens(opts.block_size, opts.vocab_size, opts.seed)
    times: list[float] = []
    requests: list[WorkloadRequest] = []
    dropped: dict[str, int] = {}  # reason -> rows
    for line, row in rows:
        if opts.max_requests is not None and len(requests) >= opts.max_requests:
            break
        cell = partial(_cell, path, line, row, columns)
        t = clock.seconds(cell("timestamp"), line) if clock is not None else 0.0
        out_len = as_count(cell("output_length"), path, line, columns["output_length"])
        text: str | None = None
        if "prompt" in columns:
            text = cell("prompt")
            if not isinstance(text, str):
                raise bad(path, line, columns["prompt"], "expected a string")
        if "input_length" in columns:
            in_len = as_count(cell("input_length"), path, line, columns["input_length"])
        else:
            in_len = opts.count_tokens(text or "")
        if in_len == 0 or out_len == 0:
            # zero-token rows are failed or empty requests in public traces: left out, and
            # counted by reason (the file's own column name) for `study create` to state
            col = columns["output_length"] if out_len == 0 else columns.get("input_length")
            why = f"{col} 0" if col is not None else f"{columns['prompt']} empty"
            dropped[why] = dropped.get(why, 0) + 1
            continue
        ids = None
        if "hash_ids" in columns:
            hashes = _hash_ids(cell("hash_ids"), path, line, columns["hash_ids"])
            ids = blocks.prompt(hashes, in_len, pad_seed=f"{opts.prefix}{len(requests)}")
        times.append(t)
        requests.append(
            WorkloadRequest(
                in_len,
                out_len,
                prompt_token_ids=ids,
                prompt_text=text,
                request_id=f"{opts.prefix}{len(requests)}",
            )
        )
    if not requests:
        raise bad(
            path, None, None, "no usable requests (empty trace or every row has a zero length)"
        )
    arrivals = scale_trace(times, time_scale=opts.time_scale, rate_scale=opts.rate_scale)
    counts = tuple(sorted(dropped.items()))
    note = f", {dropped_text(counts, len(requests))}" if counts else ""
    scale = (
        f", time x{opts.time_scale}, rate x{opts.rate_scale}"
        if (opts.time_scale, opts.rate_scale) != (1.0, 1.0)
        else ""
    )
    return Workload(
        requests, f"{kind} {path} ({len(requests)} requests{scale}{note})", dropped=counts
    ).with_arrivals(arrivals)


def dropped_text(dropped: tuple[tuple[str, int], ...], kept: int) -> str:
    """``1 of 400 rows dropped: output_tokens 0`` (reasons with their counts when several)."""
    n = sum(c for _, c in dropped)
    why = ", ".join(f"{r} ({c})" if len(dropped) > 1 else r for r, c in dropped)
    return f"{n} of {n + kept} rows dropped: {why}"


def _options(
    time_scale: float,
    rate_scale: float,
    max_requests: int | None,
    block_size: int,
    vocab_size: int,
    seed: int,
    prefix: str,
    count_tokens: TokenCounter | None,
) -> _Options:
    if max_requests is not None and max_requests < 1:
        raise ConfigError(f"max_requests must be >= 1, got {max_requests}")
    return _Options(
        time_scale,
        rate_scale,
        max_requests,
        block_size,
        vocab_size,
        seed,
        prefix,
        count_tokens or approx_token_count,
    )


def load_mooncake(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    request_id_prefix: str = "mooncake-",
) -> Workload:
    """A Mooncake trace: JSONL rows ``{"timestamp": ms, "input_length", "output_length",
    "hash_ids": [...]}``. Each hash id is a fixed block of ``block_size`` (512) token ids,
    so rows sharing leading hash ids share leading prompt tokens, as the trace intends.
    """
    cols = {f: f for f in ("timestamp", "input_length", "output_length", "hash_ids")}
    p = Path(path)
    opts = _options(
        time_scale, rate_scale, max_requests, block_size, vocab_size, seed, request_id_prefix, None
    )
    return _build(p, iter_jsonl(p), cols, _Clock(p, "timestamp", 1e-3), opts, "mooncake")


def load_azure(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    request_id_prefix: str = "azure-",
) -> Workload:
    """An Azure LLM inference trace (2023/2024): CSV ``TIMESTAMP,ContextTokens,
    GeneratedTokens`` with UTC datetimes of 7 fractional digits, all of them kept."""
    cols = {
        "timestamp": "TIMESTAMP",
        "input_length": "ContextTokens",
        "output_length": "GeneratedTokens",
    }
    p = Path(path)
    opts = _options(
        time_scale,
        rate_scale,
        max_requests,
        MOONCAKE_BLOCK_SIZE,
        vocab_size,
        seed,
        request_id_prefix,
        None,
    )
    rows = iter_csv(p, set(cols.values()))
    return _build(p, rows, cols, _Clock(p, "TIMESTAMP", 1.0), opts, "azure")


def load_trace(
    path: str | Path,
    columns: Mapping[str, str],
    *,
    fmt: Literal["csv", "jsonl"] | None = None,
    time_unit_s: float = 1.0,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    count_tokens: TokenCounter | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    request_id_prefix: str = "trace-",
) -> Workload:
    """Any CSV or JSONL trace, ``columns`` mapping :data:`TRACE_FIELDS` to the file's names.

    ``output_length`` and one of ``input_length``/``prompt`` are required. Without
    ``timestamp`` every request arrives at 0 (add a schedule from :mod:`.arrivals`).
    Numeric timestamps are multiplied by ``time_unit_s`` (0.001 for ms, like vLLM's
    ``--timed-trace-sec-multiplier``); date/time strings are read as UTC. ``fmt`` defaults
    from the suffix (``.csv``; anything else is JSONL).
    """
    p = Path(path)
    unknown = sorted(set(columns) - set(TRACE_FIELDS))
    if unknown:
        raise ConfigError(
            f"{p}: column mapping: unknown field '{unknown[0]}' "
            f"(expected {', '.join(TRACE_FIELDS)})"
        )
    if "output_length" not in columns or not {"input_length", "prompt"} & set(columns):
        raise ConfigError(
            f"{p}: column mapping: needs 'output_length' and one of 'input_length' or 'prompt'"
        )
    if not time_unit_s > 0:
        raise ConfigError(f"{p}: time_unit_s must be > 0, got {time_unit_s}")
    opts = _options(
        time_scale,
        rate_scale,
        max_requests,
        block_size,
        vocab_size,
        seed,
        request_id_prefix,
        count_tokens,
    )
    fmt = fmt or ("csv" if p.suffix.lower() == ".csv" else "jsonl")
    if fmt not in ("csv", "jsonl"):
        raise ConfigError(f"{p}: unknown trace format {fmt!r} (expected 'csv' or 'jsonl')")
    rows: Iterator[tuple[int, Mapping[str, Any]]]
    rows = iter_csv(p, set(columns.values())) if fmt == "csv" else iter_jsonl(p)
    clock = _Clock(p, columns["timestamp"], time_unit_s) if "timestamp" in columns else None
    return _build(p, rows, columns, clock, opts, f"trace ({fmt})")
