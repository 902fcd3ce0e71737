"""How trials rank: the best feasible trial, and the finest difference the protocol resolves
(pure; no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

__all__ = ["TIE", "best_trial", "feasible_ranked"]

# Two trials within this share of each other are a tie: one capacity-lattice step (1 %) is the
# finest difference the measurement protocol resolves (docs/tuning.md#1-the-capacity-lattice).
TIE = 0.01


def feasible_ranked(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The complete feasible trials, best first: the higher objective, then the earlier."""
    return sorted(
        (
            t
            for t in trials
            if t.state == TrialState.COMPLETE
            and t.value is not None
            and all(v <= 0 for v in t.constraints.values())
        ),
        key=lambda t: (t.value or 0.0, -t.number),
        reverse=True,
    )


def best_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """Highest objective among feasible trials; with none feasible, the least violating."""
    feasible = feasible_ranked(trials)
    if feasible:
        return feasible[0]
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return None
    return min(done, key=lambda t: (sum(max(v, 0.0) for v in t.constraints.values()), t.number))
