"""Reading what a worker reports: startup facts (KV capacity), failure classification.

Kept apart from the process code so the supervisor (which classifies a crash) and the vLLM
worker (which also reads KV capacity) share one implementation. Patterns follow
docs/vllm.md#7-log-lines: GPU vLLM prints ``GPU KV cache size: N tokens`` and ``Maximum
concurrency for L tokens per request: Xx`` on two lines; the CPU backend of 0.32 prints both
on one ``CPU ...`` line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autotune.failures import FailureClass, FailureMatch, classify_log

__all__ = [
    "StartupFacts",
    "classify_worker_log",
    "last_error_line",
    "log_tail",
    "parse_cache_config_info",
    "parse_startup_facts",
]

_KV_TOKENS_RE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
_CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_CACHE_INFO_RE = re.compile(r"^vllm:cache_config_info\{(.*)\}", re.MULTILINE)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# What counts as an error line when no known failure text matched: logging levels (vLLM and
# uvicorn print them in capitals), a Python exception's last line ("RuntimeError: ...",
# "pydantic_core._pydantic_core.ValidationError: ..."), argparse's "prog: error: ...".
# Case-sensitive on purpose: vLLM's WARNING lines often contain the word "error".
_ERRORISH_RE = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL)\b|^\s*[\w.]*(?:Error|Exception)\b:|(?:^|: )error: "
)
# "Traceback (most recent call last):" says nothing about the cause.
_NOISE = ("Traceback (most recent call last)",)

DEFAULT_TAIL_LINES = 60


@dataclass(frozen=True)
class StartupFacts:
    """What a started vLLM reported about its KV cache (None where the log said nothing)."""

    kv_cache_tokens: int | None
    max_concurrency: float | None
    max_model_len: int | None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup_facts(lines: Iterable[str]) -> StartupFacts:
    """KV capacity from the startup log. The last match wins: a log that holds several
    launches (appended logs) describes the newest engine at its end."""
    kv: int | None = None
    conc: float | None = None
    mml: int | None = None
    for line in lines:
        if m := _KV_TOKENS_RE.search(line):
            kv = _int(m.group(1))
        if m := _CONCURRENCY_RE.search(line):
            mml, conc = _int(m.group(1)), float(m.group(2))
    return StartupFacts(kv_cache_tokens=kv, max_concurrency=conc, max_model_len=mml)


def last_error_line(lines: Sequence[str], *, any_line: bool = True) -> str:
    """The last error-looking line, else (with ``any_line``) the last non-blank line, else
    ``""``."""
    for line in reversed(lines):
        if _ERRORISH_RE.search(line) and not any(n in line for n in _NOISE):
            return line.strip()
    if any_line:
        for line in reversed(lines):
            if line.strip():
                return line.strip()
    return ""


def classify_worker_log(lines: Iterable[str]) -> FailureMatch:
    """:func:`autotune.failures.classify_log` over the whole log, or ``UNKNOWN`` carrying the
    last error-looking line, so every failure has a class and a line to show."""
    text = list(lines)
    match = classify_log(text)
    if match is not None:
        return match
    return FailureMatch(FailureClass.UNKNOWN, last_error_line(text))


def log_tail(lines: Sequence[str], n: int = DEFAULT_TAIL_LINES, cause: str | None = None) -> str:
    """The last ``n`` lines joined, led by the classified root-cause line when it is older
    than that: real vLLM 0.32 prints a KV failure's cause 62-94 lines from the end of the log
    (above the EngineCore and API-server tracebacks), so a plain tail would lose it."""
    tail = list(lines[-n:])
    if cause and not any(cause in line for line in tail):
        tail = [cause, f"... ({len(lines) - len(tail) - 1} more lines; see the worker log)", *tail]
    return "\n".join(tail)


def parse_cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """Labels of ``vllm:cache_config_info`` on a ``/metrics`` page (None when absent)."""
    m = _CACHE_INFO_RE.search(metrics_text)
    return dict(_LABEL_RE.findall(m.group(1))) if m else None
