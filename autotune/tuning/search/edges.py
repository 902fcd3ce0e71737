"""Widening an edge of the search space that the best config sits on, once
(docs/tuning.md#8-the-staged-plan).

The concurrency ranges come from estimates made before any launch: ``max_num_seqs`` up to
twice the baseline's simulated peak concurrency, ``max_num_batched_tokens`` from 256 tokens.
When the best config the search has found lies on one of those edges, the optimum may lie
beyond it, and the coordinate passes, which polish within a factor sqrt 2 of the best
point's value, stop at the edge. So when a coordinate pass is about to start a trial and the
best feasible trial sits within :data:`NEAR` of an edge the user did not set, that edge moves
out by :data:`FACTOR`, once per edge, and the passes can step past it.

A widening is stored with the study (the attribute
:data:`~autotune.tuning.study_attrs.WIDENED_KEY`, written under the claim lock), and every
controller applies the stored widenings to the stored bounds, so a resumed study and parallel
controllers search the same space. The decision itself is pure
(:func:`widenings`); :func:`widen_at_claim` is the glue that reads and writes the attribute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.config import SearchConfig
from autotune.tuning.attrs import engine_value
from autotune.tuning.search.home_size import home_trial
from autotune.tuning.search.space import MNBT_PARAM, SpaceBounds
from autotune.tuning.search.stages import CONCURRENCY, stage_param
from autotune.tuning.study_attrs import read_widenings, write_widenings

__all__ = [
    "FACTOR",
    "NEAR",
    "Widening",
    "apply_widenings",
    "stored_widenings",
    "widen_at_claim",
    "widenings",
]

# "On an edge": within 2^(1/8) of it (9 %), half the first step of a coordinate pass
# (2^(1/4)), so a best point the passes could still move inward from is not on the edge.
NEAR = 2.0**0.125
# An edge moves out by one octave: the coordinate passes then reach sqrt 2 past the old edge
# from a best point on it, and a second octave is there for later passes.
FACTOR = 2.0

Side = Literal["floor", "ceiling"]


@dataclass(frozen=True)
class Widening:
    """One edge moved out: ``param``'s ``side`` from ``old`` to ``new``, because trial
    ``trial``, the best so far, ran at ``value``."""

    param: str
    side: Side
    old: int
    new: int
    trial: int
    value: int

    def line(self) -> str:
        """As the plan prints it."""
        return (
            f"{self.param} {self.side} widened from {self.old} to {self.new}: the best "
            f"trial, {self.trial}, ran at {self.value}, on the edge"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Widening:
        side: Side = "floor" if d["side"] == "floor" else "ceiling"
        return cls(
            str(d["param"]), side, int(d["old"]), int(d["new"]), int(d["trial"]), int(d["value"])
        )


def apply_widenings(b: SpaceBounds, ws: Sequence[Widening]) -> SpaceBounds:
    """The bounds with every stored widening applied, in order."""
    for w in ws:
        if w.param == "max_num_seqs":
            b = replace(b, mns_low=w.new) if w.side == "floor" else replace(b, mns_high=w.new)
        else:
            b = replace(b, mnbt_low=w.new) if w.side == "floor" else replace(b, mnbt_high=w.new)
    return b


def _user_set(search: SearchConfig | None, param: str, side: Side) -> bool:
    """An edge the study config names is the user's, never widened."""
    if search is None:
        return False
    spec = search.max_num_seqs if param == "max_num_seqs" else search.max_num_batched_tokens
    return (spec.low if side == "floor" else spec.high) is not None


def widenings(
    b: SpaceBounds,
    best: Mapping[str, Any],
    *,
    trial: int,
    done: Sequence[Widening] = (),
    search: SearchConfig | None = None,
) -> list[Widening]:
    """The edges to widen now (pure): those of the concurrency knobs that the best point's
    engine values ``best`` sit on (within :data:`NEAR`; a value beyond the range, the
    baseline's, counts as on it), that were not widened before (``done``) and that the user
    did not set. A token-budget floor below the best point's valid minimum
    (``max_num_seqs``; ``max_model_len`` with chunked prefill off) is not the floor that
    binds: widening it would change nothing."""
    seen = {(w.param, w.side) for w in done}
    out: list[Widening] = []
    for param in CONCURRENCY:
        if param not in best:
            continue
        v = int(best[param])
        lo, hi = (b.mns_low, b.mns_high) if param == "max_num_seqs" else (b.mnbt_low, b.mnbt_high)
        valid_min = 1
        if param == MNBT_PARAM:
            mns = int(best.get("max_num_seqs", 1))
            mml = int(best.get("max_model_len", 0))
            valid_min = max(mns, 0 if b.enable_chunked_prefill else mml, 1)
        edges: list[tuple[Side, bool, int]] = [
            ("floor", v <= lo * NEAR and lo > valid_min, max(valid_min, math.floor(lo / FACTOR))),
            ("ceiling", v >= hi / NEAR, math.ceil(hi * FACTOR)),
        ]
        for side, on_edge, new in edges:
            if on_edge and (param, side) not in seen and not _user_set(search, param, side):
                old = lo if side == "floor" else hi
                out.append(Widening(param, side, old, new, trial, v))
    return out


def stored_widenings(study: Mapping[str, Any] | optuna.Study) -> list[Widening]:
    """The widenings a study (or its user attributes) holds, in the order they were made."""
    return [Widening.from_dict(d) for d in read_widenings(study)]


def _engine_values(t: FrozenTrial) -> dict[str, Any]:
    names = ("max_model_len", *CONCURRENCY)
    return {n: v for n in names if (v := engine_value(t, n)) is not None}


def widen_at_claim(
    study: optuna.Study,
    base: SpaceBounds,
    trials: Sequence[FrozenTrial],
    stage: str,
    search: SearchConfig | None,
) -> tuple[SpaceBounds, list[Widening]]:
    """The bounds the next trial is searched in: the stored bounds ``base`` with the stored
    widenings applied, plus any widening a coordinate pass of the staged plan (``stage``
    ``max_num_seqs.2``, ``max_num_batched_tokens.3``, ...) makes now, stored before the trial
    is asked for. Returns the bounds and the new widenings (to tell). Call it under the
    study's claim lock."""
    done = stored_widenings(study)
    b = apply_widenings(base, done)
    param, k = stage_param(stage)
    if param not in CONCURRENCY or k < 2:
        return b, []  # pass 1 and the joint refinement search the ranges set at create
    best = home_trial(trials)
    if best is None or best.value is None or any(v > 0 for v in best.constraints.values()):
        return b, []  # no feasible best: nothing sits on an edge yet
    new = widenings(b, _engine_values(best), trial=best.number, done=done, search=search)
    if new:
        write_widenings(study, [asdict(w) for w in [*done, *new]])
    return apply_widenings(b, new), new
