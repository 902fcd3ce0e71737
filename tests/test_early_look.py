"""The validation phase's early look (autotune/tuning/measure/early_look.py,
docs/tuning.md#7-validation, "Stopping early"): when it looks and at which confidence."""

from __future__ import annotations

import pytest

from autotune.store import RepeatRecord
from autotune.tuning.measure.early_look import look_after, look_confidence, overlength_bound


@pytest.mark.parametrize(
    "repeats,look",
    [(1, None), (2, None), (3, None), (4, 3), (5, 3), (6, 4), (10, 6), (20, 12), (21, 15)],
)
def test_the_look_falls_on_a_round_boundary_past_three_fifths(
    repeats: int, look: int | None
) -> None:
    # 20 repeats run in blocks of 4 (every config has 4k runs at a round's end), 21 in
    # blocks of 5; fewer than 4 repeats leave nothing to save after 3
    assert look_after(repeats) == look


def test_the_look_spends_half_the_error_rate() -> None:
    assert look_confidence(0.95) == pytest.approx(0.975)
    assert look_confidence(0.9) == pytest.approx(0.95)


def _runs(trial: int, rates: list[float], requests: int) -> list[RepeatRecord]:
    return [
        RepeatRecord(
            "s", i, 0, trial, "candidate", {}, "x", 0, 0, overlength_rate=r, requests=requests
        )
        for i, r in enumerate(rates)
    ]


def test_the_overlength_bound_keeps_a_rate_near_its_limit_running() -> None:
    # the RAG benchmark study: 0.5 % pooled over 3 samples, 0.57 % over 5 against a 0.5 %
    # limit; 3 samples cannot settle it. A config that cut nothing in 1,200 requests can.
    near = overlength_bound(_runs(1, [0.004, 0.005, 0.006], 1000), 0.975)
    assert near is not None and near > 0.005
    clean = overlength_bound(_runs(1, [0.0, 0.0, 0.0], 400), 0.975)
    assert clean == pytest.approx(1.96**2 / 1200 / (1 + 1.96**2 / 1200), rel=1e-3)
    assert overlength_bound(_runs(1, [0.0], 0), 0.975) is None  # nothing counted
