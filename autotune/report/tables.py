"""``study show`` and ``study list``: rows for scripts (``--json``) and tables that fit the
terminal (pure; docs/report.md#6-terminal-tables).

``show`` picks its columns by width: the trial, its state and stage, the four engine values,
output tok/s, capacity, the p99s and the violation (word-wrapped into the room left, never
cutting a number) always; the bottleneck, capacity scale and KV cache tokens as room
allows. ``--wide`` shows every column at full width.
Numbers are never cut or abbreviated: a column that does not fit is left out, and the legend
under the table names what was left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from autotune.report.bounds import trial_capacity
from autotune.report.levels import record_stopped, stop_row
from autotune.report.study_view import ENGINE_KEYS
from autotune.store import StudySummary, TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.findings import capacity_rps, why_infeasible

__all__ = [
    "LIST_SCHEMA",
    "SHOW_SCHEMA",
    "Column",
    "list_json",
    "list_table",
    "short_stage",
    "show_json",
    "show_rows",
    "show_table",
    "spread_lines",
]

SHOW_SCHEMA = "autotune.study-show/1"
LIST_SCHEMA = "autotune.study-list/1"

_STATES = {
    "COMPLETE": "done",
    "PRUNED": "settled",  # docs/tuning.md#14-settling-losing-trials
    "FAIL": "failed",
    "RUNNING": "running",
    "WAITING": "waiting",
}
# Stage names are engine arg names; the narrow table says them shorter (the legend explains)
_SHORT_STAGE = {
    "max_model_len": "model_len",
    "gpu_memory_utilization": "gpu_util",
    "max_num_seqs": "num_seqs",
    "max_num_batched_tokens": "batch_tok",
}


def short_stage(stage: str) -> str:
    """A stage label as the narrow table says it, the pass kept: ``max_num_batched_tokens.2``
    is ``batch_tok.2``."""
    name, dot, k = stage.rpartition(".")
    if dot and k.isdigit() and name in _SHORT_STAGE:
        return f"{_SHORT_STAGE[name]}.{k}"
    return _SHORT_STAGE.get(stage, stage)


def show_rows(
    trials: Sequence[TrialRecord], mode: str = "slo-capacity", lattice: Lattice | None = None
) -> list[dict[str, Any]]:
    """One mapping per trial (``study show --json``'s ``trials``); ``capacity`` carries the
    search's status beside the number (autotune.report.bounds; ``lattice``: the study's)."""
    rows = []
    for t in trials:
        cap = trial_capacity(t, lattice, mode)
        lv = t.headline_level()
        stop = record_stopped(lv)  # a stopped level shows only what it measured
        rows.append(
            {
                "trial": t.optuna_trial_number,
                "stage": t.stage,
                "state": t.state,
                "engine_args": dict(t.engine_args),
                "output_tok_s": t.objective,
                "feasible": t.feasible,
                "capacity_scale": t.capacity_scale,
                "capacity_rps": capacity_rps(t),
                "capacity": cap.to_dict() if cap is not None else None,
                "p99_ttft_ms": lv.p99_ttft_ms if lv is not None else None,
                "p99_tpot_ms": lv.p99_tpot_ms if lv is not None else None,
                **(stop_row(stop) if stop is not None else {"stopped": None}),
                "violations": list(lv.violation_texts) if lv is not None and not t.feasible else [],
                "why_infeasible": why_infeasible(t, mode),
                "failure_class": t.failure_class,
                "kv_cache_tokens": t.kv_cache_tokens,
                "diagnosis": (t.diagnosis or {}).get("kind"),
                # its levels are this trial's, no worker started
                # (docs/tuning.md#14-settling-losing-trials)
                "inferred_from": t.inferred_from,
            }
        )
    return rows


def spread_lines(trials: Sequence[TrialRecord], mode: str, lattice: Lattice | None) -> list[str]:
    """Under ``study show``'s table: the capacity's spread of each trial whose boundary was
    measured more than once or whose runs went up and down with load
    (docs/tuning.md#1-the-capacity-lattice, "Noise")."""
    out = []
    for t in trials:
        cap = trial_capacity(t, lattice, mode)
        text = cap.spread_text() if cap is not None else None
        if text:
            out.append(f"trial {t.optuna_trial_number} capacity's spread: {text}")
    return out


def show_json(
    study: str, mode: str, trials: Sequence[TrialRecord], lattice: Lattice | None = None
) -> dict[str, Any]:
    return {
        "schema": SHOW_SCHEMA,
        "study": study,
        "mode": mode,
        "trials": show_rows(trials, mode, lattice),
    }


def list_json(studies: Sequence[StudySummary]) -> dict[str, Any]:
    return {
        "schema": LIST_SCHEMA,
        "studies": [
            {
                "name": s.name,
                "mode": s.mode,
                "worker": s.worker_kind,
                "created_at": s.created_at.isoformat(),
                "trials": s.n_trials,
                "complete": s.n_complete,
                "best_output_tok_s": s.best_objective,
            }
            for s in studies
        ],
    }


def list_table(studies: Sequence[StudySummary]) -> Table:
    table = Table(title="studies", box=box.SIMPLE_HEAD)
    for col in ("name", "mode", "worker", "created", "trials", "complete", "best tok/s"):
        table.add_column(col, no_wrap=True, justify="right" if col[0] in "tcb" else "left")
    for s in studies:
        table.add_row(
            s.name,
            s.mode,
            s.worker_kind,
            s.created_at.strftime("%Y-%m-%d %H:%M"),
            str(s.n_trials),
            str(s.n_complete),
            f"{s.best_objective:,.1f}" if s.best_objective is not None else "-",
        )
    return table


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ge(row: dict[str, Any], key: str) -> str:
    """``≥`` before a stopped level's lower bound."""
    stop = row.get("stopped")
    return "≥" if stop and key in stop["bounds"] and row[key] is not None else ""


def _cap(row: dict[str, Any]) -> str:
    """The capacity cell: ``≥16.00`` at the top of the range, ``<1.00`` below its bottom
    (the legend says so), the measured rate otherwise."""
    cap = row.get("capacity")
    if cap and cap["bound"] and cap["rps"] is not None:
        return f"{cap['bound']}{cap['rps']:,.2f}"
    return _f(row["capacity_rps"], ",.2f")


def _lat(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


@dataclass(frozen=True)
class Column:
    key: str
    head: str  # narrow header
    wide_head: str
    numeric: bool
    required: bool
    wraps: bool = False  # text that word-wraps into what room is left (at least _MIN_TEXT)


_COLUMNS = (
    Column("trial", "trial", "trial", True, True),
    Column("state", "state", "state", False, True),
    Column("stage", "stage", "stage", False, True),
    Column("max_model_len", "len", "max_model_len", True, True),
    Column("gpu_memory_utilization", "util", "gpu_memory_utilization", True, True),
    Column("max_num_seqs", "seqs", "max_num_seqs", True, True),
    Column("max_num_batched_tokens", "batch", "max_num_batched_tokens", True, True),
    Column("output_tok_s", "tok/s", "output tok/s", True, True),
    Column("capacity_rps", "req/s", "capacity req/s", True, True),
    Column("p99_ttft_ms", "TTFT", "p99 TTFT ms", True, True),
    Column("p99_tpot_ms", "TPOT", "p99 TPOT ms", True, True),
    Column("violation", "violation", "why infeasible", False, True, wraps=True),
    Column("diagnosis", "bottleneck", "bottleneck", False, False),
    Column("capacity_scale", "scale", "capacity scale", True, False),
    Column("kv_cache_tokens", "KV tokens", "KV cache tokens", True, False),
)
_MIN_TEXT = 14  # a wrapped text column narrower than this helps nobody
_SEP = 2  # between two columns: the divider and one padding space (no outer edge)


def _cells(row: dict[str, Any], wide: bool) -> dict[str, str]:
    ea = row["engine_args"]
    if row["feasible"] or row["state"] != "COMPLETE":
        violation = "-" if row["feasible"] is not False else "infeasible"
    elif wide:
        violation = row["why_infeasible"] or "infeasible"
    elif row["violations"]:
        violation = "; ".join(row["violations"])
        violation += f" ({row['stopped']['text']})" if row.get("stopped") else ""
    else:
        violation = f"worker: {row['failure_class']}" if row["failure_class"] else "infeasible"
    stage = row["stage"] if wide else short_stage(row["stage"])
    return {
        "trial": str(row["trial"]),
        "state": (
            _STATES.get(row["state"], row["state"].lower())
            if row.get("inferred_from") is None
            else "inferred"
        ),
        "stage": stage,
        **{k: "-" if ea.get(k) is None else f"{ea[k]:g}" for k in ENGINE_KEYS},
        "output_tok_s": _f(row["output_tok_s"], ",.1f"),
        "capacity_rps": _cap(row),
        **{k: _ge(row, k) + _lat(row[k]) for k in ("p99_ttft_ms", "p99_tpot_ms")},
        "violation": violation,
        "diagnosis": row["diagnosis"] or "-",
        "capacity_scale": _f(row["capacity_scale"], ".3f"),
        "kv_cache_tokens": _f(row["kv_cache_tokens"], ","),
    }


def show_table(
    study: str, rows: Sequence[dict[str, Any]], width: int, *, wide: bool = False
) -> tuple[Table, str, int]:
    """The table for a terminal ``width`` columns wide, the legend line under it, and the
    width to print it at: ``width``, or the table's own when even the always-shown columns
    need more (a terminal then wraps the lines; nothing is cut)."""
    cells = [_cells(r, wide) for r in rows]

    def natural(c: Column) -> int:
        head = c.wide_head if wide else c.head
        return max([len(head), *(len(x[c.key]) for x in cells)])

    def need(c: Column) -> int:  # the least room the column takes
        return natural(c) if wide or not c.wraps else min(natural(c), _MIN_TEXT)

    chosen = [c for c in _COLUMNS if c.required or wide]
    used = sum(need(c) for c in chosen) + _SEP * (len(chosen) - 1)
    if not wide:
        for c in _COLUMNS:
            if not c.required and used + _SEP + need(c) <= width:
                chosen.append(c)
                used += _SEP + need(c)
    chosen.sort(key=_COLUMNS.index)
    table = Table(
        title=f"study {study}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 0, 0, 1),  # one space before each column, none after
    )
    for c in chosen:
        table.add_column(
            c.wide_head if wide else c.head,
            justify="right" if c.numeric else "left",
            no_wrap=wide or not c.wraps,
            min_width=need(c),
            overflow="fold",
        )
    for x in cells:
        table.add_row(*(x[c.key] for c in chosen))
    left = [c.wide_head for c in _COLUMNS if c not in chosen]
    legend = (
        ""
        if wide
        else "len = max_model_len, util = gpu_memory_utilization, seqs = max_num_seqs, "
        "batch = max_num_batched_tokens; tok/s = output tok/s at capacity; req/s = capacity; "
        "TTFT/TPOT = p99 ms"
        + (
            "; ≥ = at least (the top of the range), < = below the lowest load tried or, "
            "settled, below the best capacity so far"
            if any(c["capacity_rps"][:1] in ("≥", "<") for c in cells)
            else ""
        )
        + (
            "; inferred = the levels of a trial that differs only in a max_num_seqs neither "
            "engine reached, no worker started"
            if any(c["state"] == "inferred" for c in cells)
            else ""
        )
        + (f"; not shown: {', '.join(left)} (--wide)" if left else "")
    )
    full = sum(natural(c) for c in chosen) + _SEP * (len(chosen) - 1)
    return table, legend, (full if wide else max(width, used))
