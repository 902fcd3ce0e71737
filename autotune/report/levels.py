"""A load level's figures as every report shows them (pure): the CLI's progress line,
``study show``, the exports and the Markdown and HTML reports. A level the early-stop rule
ended shows only what it measured (:mod:`autotune.loadgen.stopped`,
docs/tuning.md#10-early-stop-inside-a-level): the reason and the request it stopped at, a
figure over no finished request as not measured (never 0), a lower bound as one ("≥"), and a
rate only once it is certain to break its limit."""

from __future__ import annotations

from typing import Any

from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stopped import Stopped, stopped_view
from autotune.store import LevelRecord
from autotune.tuning.measure.findings import record_stopped, stop_note

__all__ = [
    "export_level",
    "figure_cell",
    "progress_figures",
    "progress_note",
    "record_stopped",
    "stop_note",
    "stop_row",
]


def progress_figures(m: LevelMetrics) -> str:
    """``1,340 tok/s, p99 TTFT 572 ms, p99 TPOT 45.1 ms`` (the progress line's figures)."""
    s = stopped_view(
        m.stop,
        m.completed,
        {
            "output_throughput": m.output_throughput,
            "p99_ttft_ms": m.p99_ttft_ms,
            "p99_tpot_ms": m.p99_tpot_ms,
        },
    )
    if s is None:
        return (
            f"{m.output_throughput:,.0f} tok/s, p99 TTFT {m.p99_ttft_ms or 0:,.0f} ms, "
            f"p99 TPOT {m.p99_tpot_ms or 0:,.1f} ms"
        )
    tok = s.text("output_throughput", ",.0f", " tok/s")
    return (
        f"{'tok/s not measured' if tok == 'not measured' else tok}, "
        f"p99 TTFT {s.text('p99_ttft_ms', ',.0f', ' ms')}, "
        f"p99 TPOT {s.text('p99_tpot_ms', ',.1f', ' ms')}"
    )


def progress_note(m: LevelMetrics) -> str:
    """`` (stopped early on p99 TTFT at request 103 of 400)`` after a stopped level's
    progress line (:func:`stop_note`'s words), else ""."""
    return m.stop.note if m.stop is not None else ""


def figure_cell(lv: LevelRecord | None, key: str, fmt: str = ",.1f") -> str:
    """A level's figure (``key``, a field) in a report table: ``-`` when none or not
    measured, ``≥ x`` for a stopped level's lower bound."""
    value = getattr(lv, key) if lv is not None else None
    s = record_stopped(lv)
    if s is not None:
        value = s.values.get(key)
    if value is None:
        return "-"
    return f"{'≥ ' if s is not None and key in s.bounds else ''}{value:{fmt}}"


def _stopped(s: Stopped) -> dict[str, Any]:
    """``stopped`` in rows and exports: why and when (:meth:`StopInfo.to_dict`), which
    figures are not measured and which are lower bounds."""
    return s.stop.to_dict() | {"not_measured": s.not_measured, "bounds": sorted(s.bounds)}


def stop_row(s: Stopped) -> dict[str, Any]:
    """A ``study show`` row's p99s of a stopped headline level, and its ``stopped``."""
    return {k: s.values.get(k) for k in ("p99_ttft_ms", "p99_tpot_ms")} | {"stopped": _stopped(s)}


def export_level(d: dict[str, Any], lv: LevelRecord) -> None:
    """A stopped level's exported row: its figures as shown (null: not measured) and
    ``stopped``: ``reason``, ``at_request`` and ``planned_requests`` (fewer sent than planned:
    stopped early); its lower bounds are the violations marked ``bound``. Kept that short
    because most levels of a study stop (docs/report.md#5-machine-readable-output). A level
    that ran to its end is left as it is."""
    s = record_stopped(lv)
    if s is not None:
        d.update(s.values)
        d["stopped"] = {
            k: s.stop.to_dict()[k] for k in ("reason", "at_request", "planned_requests")
        }
