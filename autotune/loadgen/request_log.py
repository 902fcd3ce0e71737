"""A level's per-request records as JSON lines, the ``requests-jsonl`` format
(docs/loadgen.md#6-per-request-records).

Each line is one request in the shape ``vllm bench serve --save-detailed`` gives a run: its
per-request arrays (``input_lens``, ``output_lens``, ``start_times``, ``ttfts``, ``itls``,
``latencies``, ``queue_times``, ``generated_texts``, ``errors``) as one object per request
under the singular names, then the fields autotune needs to read the records back as they
were (every time, the requested and the server-counted prompt lengths, the over-length and
truncation marks). This module owns the format: :func:`requests_jsonl`
writes it, :func:`encode_requests` compresses it as the store keeps it, and
:func:`parse_requests` / :func:`read_requests` are the one reader, which also takes lines
that hold only vLLM's fields.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs import special_file
from autotune.loadgen.bench_stats import RequestRecord
from autotune.store import RequestLog

__all__ = [
    "FORMAT",
    "VLLM_FIELDS",
    "decode_requests",
    "encode_requests",
    "parse_requests",
    "read_requests",
    "request_line",
    "requests_jsonl",
]

FORMAT = "requests-jsonl"
# vLLM's per-request fields (its arrays, singular), in the order a line holds them
VLLM_FIELDS = (
    "input_len",
    "output_len",
    "start_time",
    "ttft",
    "itl",
    "latency",
    "queue_time",
    "generated_text",
    "error",
)
# the ones a line must have; the rest default from these
_REQUIRED = ("input_len", "output_len", "ttft", "itl", "latency", "error")
_DIGITS = 9  # decimals of a second kept: nanoseconds


def _ns(t: float | None) -> float | None:
    """A time in seconds kept to the nanosecond: the resolution of the clock that took it
    (``time.perf_counter``), and half the stored size of full float precision
    (docs/loadgen.md#6-per-request-records). None for no time (JSON has no NaN)."""
    return None if t is None or not math.isfinite(t) else round(t, _DIGITS)


def request_line(r: RequestRecord) -> dict[str, Any]:
    """One request as a line's object: vLLM's fields, then autotune's (times in seconds from
    the level's start; a failed request's TTFT and latency are null where vLLM writes 0)."""
    queue = None if r.sent_at is None else r.sent_at - r.scheduled_at
    return {
        "input_len": r.input_tokens,
        "output_len": r.output_tokens,
        "start_time": _ns(r.sent_at),
        "ttft": _ns(r.ttft),
        "itl": [round(gap, _DIGITS) for gap in r.itl if math.isfinite(gap)],
        "latency": _ns(r.e2el),
        "queue_time": _ns(queue),
        # the client reads chunks, never their text (docs/loadgen.md#6-per-request-records)
        "generated_text": "",
        "error": r.error,
        "request_id": r.request_id,
        "success": r.success,
        "http_status": r.http_status,
        "prompt_len": r.prompt_len,
        "prompt_tokens": r.prompt_tokens,
        "scheduled_at": _ns(r.scheduled_at),
        "first_token_at": _ns(r.first_token_at),
        "last_token_at": _ns(r.last_token_at),
        "finished_at": _ns(r.finished_at),
        "over_length": r.over_length,
        "truncated": r.truncated,
    }


def requests_jsonl(records: Iterable[RequestRecord]) -> str:
    """The measured records (warm-ups left out) as requests-jsonl text, one line each."""
    lines = [
        json.dumps(request_line(r), separators=(",", ":"), allow_nan=False)
        for r in records
        if not r.warmup
    ]
    return "".join(line + "\n" for line in lines)


def encode_requests(records: Sequence[RequestRecord]) -> RequestLog:
    """The measured records as the store keeps them: requests-jsonl, gzip-compressed
    (``mtime=0``: the same records give the same bytes)."""
    text = requests_jsonl(records).encode("utf-8")
    return RequestLog(
        requests=text.count(b"\n"),
        raw_bytes=len(text),
        data=gzip.compress(text, compresslevel=6, mtime=0),
    )


def decode_requests(data: bytes) -> str:
    """The requests-jsonl text of what :func:`encode_requests` made."""
    return gzip.decompress(data).decode("utf-8")


class _Line:
    """One parsed line, read field by field with one-line errors naming the field."""

    def __init__(self, source: str, number: int, obj: dict[str, Any]) -> None:
        self.where, self.obj = f"{source}:{number}", obj
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise ConfigError(f"{self.where}: field '{missing[0]}' is missing")

    def _bad(self, key: str, what: str) -> ConfigError:
        given = repr(self.obj[key])
        given = given if len(given) <= 60 else given[:57] + "..."
        return ConfigError(f"{self.where}: field '{key}' must be {what}, not {given}")

    def number(self, key: str, default: float | None = None) -> float | None:
        v = self.obj.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self._bad(key, "a finite number or null")
        return float(v)

    def count(self, key: str, default: int | None = None) -> int | None:
        v = self.obj.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise self._bad(key, "a whole number >= 0")
        return v

    def need_count(self, key: str) -> int:
        v = self.count(key)
        if v is None:
            raise self._bad(key, "a whole number >= 0")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.obj.get(key, default)
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def text(self, key: str, default: str) -> str:
        v = self.obj.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def gaps(self) -> list[float]:
        v = self.obj["itl"]
        if not isinstance(v, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in v
        ):
            raise self._bad("itl", "a list of numbers")
        return [float(x) for x in v]


def _record(line: _Line, number: int) -> RequestRecord:
    """The record of one line; fields only autotune writes default from vLLM's."""
    error = line.text("error", "")
    sent = line.number("start_time")
    queue = line.number("queue_time")
    ttft, e2el = line.number("ttft"), line.number("latency")
    output, prompt = line.need_count("output_len"), line.need_count("input_len")
    at = sent if sent is not None else 0.0
    first = line.number("first_token_at", None if ttft is None else at + ttft)
    last = line.number("last_token_at", None if e2el is None else at + e2el)
    return RequestRecord(
        request_id=line.text("request_id", f"line-{number}"),
        success=line.flag("success", not error),
        error=error,
        http_status=line.count("http_status"),
        prompt_len=line.count("prompt_len", prompt) or 0,
        prompt_tokens=line.count("prompt_tokens", prompt if "prompt_len" not in line.obj else None),
        output_tokens=output,
        scheduled_at=line.number("scheduled_at", at - (queue or 0.0)) or 0.0,
        sent_at=sent,
        first_token_at=first,
        last_token_at=last,
        finished_at=line.number("finished_at", last if last is not None else at) or 0.0,
        itl=line.gaps(),
        ttft=ttft,
        e2el=e2el,
        over_length=line.flag("over_length", False),
        truncated=line.flag("truncated", False),
    )


def parse_requests(text: str, source: str = "<requests>") -> list[RequestRecord]:
    """The records of requests-jsonl ``text`` (blank lines skipped); a bad line is one
    ConfigError naming ``source``, the line and the field."""
    out: list[RequestRecord] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{number}: malformed JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{source}:{number}: a line must be a JSON object")
        out.append(_record(_Line(source, number, obj), number))
    return out


def read_requests(path: Path) -> list[RequestRecord]:
    """The records of a requests-jsonl file (gzip-compressed when its name ends ``.gz``)."""
    if (why := special_file(path)) is not None:
        raise ConfigError(f"{path}: {why}")
    try:
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_requests(text, str(path))
