"""The ground-truth search of ``benchmarks/truth.py`` on a stub measurement: a longest
``max_model_len`` candidate at which nothing is feasible (one request far longer than the
rest sets it) must not crash the grid (docs/tuning.md#5-re-measurement-and-ground-truth)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.tuning.search.space import SpaceBounds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from truth import _Search


class _Stub(_Search):
    """Scores a config without simulating: feasible (its token budget) only at or below
    ``feasible_mml``; infeasible configs score 0, as measure_config's objective does."""

    def __init__(self, b: SpaceBounds, feasible_mml: int) -> None:  # no scenario, no sim
        self.b, self.feasible_mml = b, feasible_mml
        self.seen: dict[str, float] = {}
        self.best: tuple[float, dict[str, Any]] = (0.0, {})
        self.best_scale = None

    def eval(self, ea: dict[str, Any]) -> float:
        obj = float(ea["max_num_batched_tokens"]) if ea["max_model_len"] <= self.feasible_mml else 0
        self.seen[repr(sorted(ea.items()))] = obj
        if obj > self.best[0]:
            self.best = (obj, dict(ea))
        return obj


B = SpaceBounds(max_model_len_candidates=(6912, 34560), mns_low=8, mns_high=64)


def test_grid_falls_back_to_a_shorter_candidate_when_the_longest_has_nothing_feasible() -> None:
    s = _Stub(B, feasible_mml=6912)
    s.grid()  # raised KeyError: 'max_num_seqs' when nothing at 34560 was feasible
    assert s.best[1]["max_model_len"] == 6912
    assert s.best[0] > 0


def test_grid_stays_at_the_longest_candidate_when_it_has_a_feasible_config() -> None:
    s = _Stub(B, feasible_mml=34560)
    s.grid()
    grid_mmls = {k for k in s.seen if "6912" in k}
    # only the memory sweep at the grid's best visits the shorter candidate: 3 configs
    assert len(grid_mmls) == 3


def test_grid_with_nothing_feasible_anywhere_says_so() -> None:
    with pytest.raises(RuntimeError, match=r"no feasible config.*6912, 34560"):
        _Stub(B, feasible_mml=0).grid()
