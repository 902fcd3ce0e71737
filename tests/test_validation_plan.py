"""The validation phase's plan (docs/tuning.md#7-validation, "One worker for a block of
runs"): blocks of repeats per config, rounds in reversed order, and what that saves."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from support.studies import config

from autotune.store import TrialRecord
from autotune.tuning.measure.validation_plan import block_size, plan_runs, run_order


def _trial(n: int) -> TrialRecord:
    return TrialRecord(
        study_name="t",
        optuna_trial_number=n,
        stage="baseline" if n == 0 else "joint",
        state="COMPLETE",
        params={},
        engine_args={"max_num_seqs": 8 + n},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
    )


def _order(repeats: int, k: int) -> list[Any]:
    cfg = config(strategy={"validate": {"repeats": repeats}})[0]
    base, *cands = (_trial(n) for n in range(k))
    return run_order(plan_runs(cfg, base, cands), repeats)


@pytest.mark.parametrize(("repeats", "size"), [(1, 1), (3, 1), (5, 1), (6, 2), (20, 4)])
def test_a_block_holds_repeats_over_five_rounds(repeats: int, size: int) -> None:
    assert block_size(repeats) == size


@pytest.mark.parametrize(("repeats", "k", "starts"), [(5, 2, 6), (5, 3, 11), (20, 3, 11)])
def test_each_config_runs_every_repeat_once_and_a_worker_serves_each_block(
    repeats: int, k: int, starts: int
) -> None:
    runs = _order(repeats, k)
    pairs = [(r.repeat_index, r.trial_number) for r in runs]
    assert sorted(pairs) == [(i, n) for i in range(repeats) for n in range(k)]
    # a worker is started whenever the config changes from one run to the next
    changes = 1 + sum(a.trial_number != b.trial_number for a, b in itertools.pairwise(runs))
    assert changes == starts
    # all runs of one repeat share its sample and seed (they pair up)
    for i in range(repeats):
        seeds = {(r.workload_seed, r.jitter_seed) for r in runs if r.repeat_index == i}
        assert len(seeds) == 1


def test_twenty_one_level_repeats_run_in_blocks_of_four_in_reversed_rounds() -> None:
    runs = _order(20, 3)  # the one-level modes' default repeats
    blocks = [
        (runs[j].trial_number, [r.repeat_index for r in runs[j : j + 4]]) for j in range(0, 60, 4)
    ]
    assert blocks[:6] == [
        (0, [0, 1, 2, 3]),
        (1, [0, 1, 2, 3]),
        (2, [0, 1, 2, 3]),
        (2, [4, 5, 6, 7]),
        (1, [4, 5, 6, 7]),
        (0, [4, 5, 6, 7]),
    ]
    # over each pair of rounds every config's runs sit symmetric about the pair's middle:
    # linear drift over time moves every config's mean alike
    for first in range(0, 48, 24):
        pair = runs[first : first + 24]
        means = {n: sum(i for i, r in enumerate(pair) if r.trial_number == n) / 8 for n in range(3)}
        assert all(m == pytest.approx(11.5) for m in means.values())
