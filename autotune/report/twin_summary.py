"""What a twin study says about its twin (docs/tuning.md#15-the-twin-strategy): each twin
trial's predicted objective beside what it measured, and the last round's fit and verdict.
Pure: it takes the stored round and predictions, and the trials."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.store import TrialRecord

__all__ = ["twin_lines"]


def twin_lines(
    round_: Mapping[str, Any] | None,
    predictions: Mapping[int, float],
    trials: Sequence[TrialRecord],
) -> list[str]:
    """Lines for ``study show`` (none for a study of another strategy)."""
    if round_ is None and not predictions:
        return []
    out = []
    errs = []
    parts = []
    for t in trials:
        pred = predictions.get(t.optuna_trial_number)
        if pred is None or not t.objective:
            continue
        e = (pred / t.objective - 1.0) * 100.0
        errs.append(abs(e))
        parts.append(
            f"trial {t.optuna_trial_number} {pred:,.1f} predicted, {t.objective:,.1f} measured "
            f"({e:+.1f} %)"
        )
    if parts:
        out.append(
            f"twin: {'; '.join(parts)}; median error {statistics.median(errs):.1f} % over "
            f"{len(errs)} trial(s)"
        )
    if round_ is not None:
        fit = ", ".join(f"{k} {v:.1f} %" for k, v in round_.get("residual_pct", {}).items())
        line = f"twin: last fit's median error per level figure: {fit or 'n/a'}"
        if round_.get("stop"):
            line += f"; the search stopped: {round_['stop']}"
        out.append(line)
    return out
