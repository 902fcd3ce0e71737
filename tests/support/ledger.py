"""The fault ledger: what each injected fault cost a study (docs/faults.md#9-the-fault-ledger).

``tests/test_faults.py`` adds one row per fault; ``tests/conftest.py`` prints the table at
the end of the session, and ``$AUTOTUNE_FAULT_LEDGER`` names a JSON file to write it to.
The figures are read from the study's database after the study finished, never from what
the controllers said about themselves.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.store import Store
from autotune.tuning.attrs import label_of, stage_of

__all__ = [
    "ROWS",
    "LedgerRow",
    "StudyFigures",
    "format_table",
    "study_figures",
    "worker_pids",
    "write_json",
]

CATEGORICAL_STAGES = ("max_model_len",)


@dataclass
class StudyFigures:
    planned: int
    complete: int
    lost: int  # planned trials that never completed
    duplicates: int  # completions beyond one per configuration that must run once
    disagreements: int  # trials whose state differs between autotune and Optuna
    retries: int  # retry trials queued
    idle_s: float  # controllers waiting for others' trials, summed
    stage_order_kept: bool


@dataclass
class LedgerRow:
    fault: str
    lost: int
    duplicates: int
    orphans: int
    recover_s: float | None  # fault -> the study runs a trial again (None: nothing to recover)
    idle_s: float
    disagreements: int
    note: str = ""
    detect_s: float | None = None  # fault -> the watch saw it (worker faults)
    clean_verdict: bool | None = None  # the config's verdict came from a clean run


ROWS: list[LedgerRow] = []


def _config_key(t: optuna.trial.FrozenTrial) -> tuple[object, ...]:
    """What must run once: an enqueued config by its label, a retry as the trial it
    retries, a categorical stage's choice by its value, anything else by its number."""
    history = t.system_attrs.get("retry_history") or []
    stage, label = stage_of(t), label_of(t)
    if label:
        return ("label", label)
    if stage in CATEGORICAL_STAGES:
        return ("choice", stage, t.params.get(str(stage)))
    return ("trial", history[0] if history else t.number)


def study_figures(url: str, name: str, planned: int, stage_order: list[str]) -> StudyFigures:
    with Store.open(url) as store:
        rows = {r.optuna_trial_number: r for r in store.trials(name, with_levels=False)}
        study = optuna.load_study(study_name=name, storage=store.optuna_storage())
        trials = study.get_trials(deepcopy=False)
        idle = sum(c.idle_s for c in store.fleet().controllers(name))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    counts = Counter(_config_key(t) for t in complete)
    duplicates = sum(n - 1 for n in counts.values()) + max(0, len(complete) - planned)
    disagreements = 0
    for t in trials:
        row = rows.get(t.number)
        if row is not None and row.state != t.state.name:
            disagreements += 1
    disagreements += sum(1 for n in rows if n not in {t.number for t in trials})
    stages = [stage_of(t) for t in complete]
    order = [stage_order.index(s) for s in stages if s is not None and s in stage_order]
    return StudyFigures(
        planned=planned,
        complete=len(complete),
        lost=max(0, planned - len(complete)),
        duplicates=duplicates,
        disagreements=disagreements,
        retries=sum(1 for t in trials if t.system_attrs.get("retry_history")),
        idle_s=idle,
        stage_order_kept=order == sorted(order),
    )


def worker_pids(marker: str) -> list[int]:
    """Live processes whose environment mentions ``marker`` (a test's worker folder: every
    worker's VLLM_CACHE_ROOT is under it)."""
    out = []
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in ("Z", "X"):
            out.append(int(name))
    return out


def format_table(rows: list[LedgerRow]) -> str:
    head = (
        "| fault | lost trials | duplicates | orphans | seconds to recover | idle seconds "
        "| stores disagree | seconds to detect | verdict from a clean run | note |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = f"{r.recover_s:.1f}" if r.recover_s is not None else "-"
        det = f"{r.detect_s:.1f}" if r.detect_s is not None else "-"
        clean = "-" if r.clean_verdict is None else ("yes" if r.clean_verdict else "no")
        lines.append(
            f"| {r.fault} | {r.lost} | {r.duplicates} | {r.orphans} | {rec} | {r.idle_s:.1f} "
            f"| {r.disagreements} | {det} | {clean} | {r.note} |"
        )
    return "\n".join(lines)


def write_json(path: str, rows: list[LedgerRow]) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
