"""The validation phase's plan (docs/tuning.md#7-validation, pure): which runs, on which
samples and seeds, and in which order.

Every config is re-measured on every repeat's sample. The runs go in blocks: a block holds
``block_size`` consecutive repeats of one config, so a worker started for the block serves
all of them (one start-up for the block, not one per run), and the configs take turns block
by block, in an order reversed from one round to the next (A B C, C B A, A B C, ...). So the
last block of a round and the first of the next are the same config's, which keeps its
worker too, and linear drift over time (thermal, a neighbour on the host) hits every config
alike: each config's runs lie symmetric about the middle of each pair of rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autotune.config import StudyConfig
from autotune.store import RepeatRecord, TrialRecord
from autotune.workload.build import sample_description

__all__ = [
    "ROUNDS",
    "RUN_STEPS",
    "block_size",
    "plan_runs",
    "repeat_seeds",
    "run_order",
    "run_resolution",
    "worker_starts",
]

_TAG = 0x76616C69  # "vali": keeps validation seeds apart from every other seed of a study
_MASK = 0xFFFFFFFF

# Rounds of blocks at most: 5 repeats run one repeat a block (the interleaving of every
# capacity run), 20 one-level repeats four (docs/tuning.md#7-validation, "One worker for a
# block of runs").
ROUNDS = 5

# A run's capacity search steps over every RUN_STEPS-th point of the study's lattice
# (docs/tuning.md#7-validation, "A run's resolution"): a fresh sample moves a capacity by
# several steps, so one step's precision per run buys nothing the interval can see, and a
# coarser lattice saves a bisection level in every run.
RUN_STEPS = 2


def run_resolution(cfg: StudyConfig) -> float:
    """The step of a validation run's lattice, as a resolution: RUN_STEPS of the study's
    steps (its points are the study's own, every RUN_STEPS-th from ``capacity_low``)."""
    return (1.0 + cfg.strategy.capacity_resolution) ** RUN_STEPS - 1.0


def block_size(repeats: int) -> int:
    """Consecutive repeats of one config that one worker serves."""
    return max(1, math.ceil(repeats / ROUNDS))


def worker_starts(repeats: int, configs: int) -> int:
    """Workers the plan starts when each block keeps its worker: one per config in the first
    round, one fewer in every later round (its first block goes on with the last one's)."""
    if repeats < 1 or configs < 1:
        return 0
    rounds = math.ceil(repeats / block_size(repeats))
    return configs + (rounds - 1) * (configs - 1)


def repeat_seeds(cfg: StudyConfig, repeat: int) -> tuple[int, int]:
    """(workload seed, jitter seed) of validation repeat ``repeat`` (0-based): fresh, and a
    function of the study's seeds alone, so every controller plans the same samples."""
    ss = np.random.SeedSequence([cfg.workload.seed & _MASK, cfg.seed & _MASK, _TAG, repeat])
    a, b = ss.generate_state(2)
    return int(a), int(b)


def plan_runs(
    cfg: StudyConfig, baseline: TrialRecord, candidates: Sequence[TrialRecord]
) -> list[RepeatRecord]:
    """Every run of the phase, in the order :func:`run_order` sorts them: repeat ``r``'s
    ``position`` is its config's place in round ``r // block_size`` (reversed every other
    round)."""
    configs = [baseline, *candidates]
    size = block_size(cfg.validation_repeats)
    out = []
    for r in range(cfg.validation_repeats):
        ws, js = repeat_seeds(cfg, r)
        order = configs if (r // size) % 2 == 0 else configs[::-1]
        for pos, t in enumerate(order):
            out.append(
                RepeatRecord(
                    study_name=t.study_name,
                    repeat_index=r,
                    position=pos,
                    trial_number=t.optuna_trial_number,
                    role="baseline" if t is baseline else "candidate",
                    engine_args=dict(t.engine_args),
                    sample=sample_description(cfg, ws),
                    workload_seed=ws,
                    jitter_seed=js,
                )
            )
    return out


def run_order(runs: Sequence[RepeatRecord], repeats: int) -> list[RepeatRecord]:
    """``runs`` in the order they run: round by round, block by block, repeat by repeat."""
    size = block_size(repeats)
    return sorted(runs, key=lambda r: (r.repeat_index // size, r.position, r.repeat_index))
