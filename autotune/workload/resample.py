"""Resample a trace for validation repeats (pure; docs/tuning.md#7-validation).

A plain bootstrap (every request drawn with replacement from the whole trace) leaves out any
one request with probability ``(1 - 1/n)^n``, about 37 %. On a trace whose p99 latency hangs
on one rare long request that is the difference between passing and breaking the SLO: a
config that breaks the SLO on the trace passes on a third of the samples, and a gain the
trace shows is lost in intervals tens of percent wide. So the bootstrap is stratified by
length: the longest ``tail`` share of the requests (at least one), those a p99 SLO sees, is
replayed in every sample exactly as in the trace; every other request is drawn with
replacement from its own band of ``band`` requests of similar length (prompt + output).
Every position keeps its arrival time, so the trace's bursts and the place of its long
requests in them stay; what varies between samples is which of the similar requests fills
each slot.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from autotune.workload.core import Workload

__all__ = ["BAND", "TAIL", "bootstrap", "stratified_bootstrap"]

TAIL = 0.01  # the share kept in every sample: the requests a p99 SLO hangs on
BAND = 20  # requests per length band (5 % of a 400-request trace)


def _sample(wl: Workload, picks: list[int], label: str) -> Workload:
    """Position k of ``wl`` carrying request ``picks[k]`` (its arrival kept, ids made unique)."""
    reqs = [
        replace(
            wl.requests[i],
            arrival=wl.requests[k].arrival,
            request_id=f"{wl.requests[i].request_id}~{k}",
        )
        for k, i in enumerate(picks)
    ]
    return Workload(reqs, f"{wl.source}; {label}", wl.closed_loop_concurrency)


def bootstrap(wl: Workload, seed: int) -> Workload:
    """A plain bootstrap sample of ``wl``: its own arrival times (or closed loop), each
    carrying a request drawn with replacement from the whole of ``wl``."""
    rng = np.random.default_rng(seed)
    picks = [int(i) for i in rng.integers(0, len(wl), len(wl))]
    return _sample(wl, picks, f"bootstrap (seed {seed})")


def stratified_bootstrap(
    wl: Workload, seed: int, *, tail: float = TAIL, band: int = BAND
) -> Workload:
    """A bootstrap sample of ``wl`` stratified by length: its longest ``ceil(tail * n)``
    requests (at least one) in every sample at their own places, every other position
    carrying a request drawn with replacement from its band of ``band`` requests of similar
    length (ranked by prompt + output tokens, ties by position)."""
    if band < 1 or not 0.0 <= tail <= 1.0:
        raise ValueError(f"band must be >= 1 and tail in [0, 1], got {band} and {tail}")
    n = len(wl)
    rng = np.random.default_rng(seed)
    order = sorted(
        range(n), key=lambda k: (-(wl.requests[k].prompt_len + wl.requests[k].output_len), k)
    )
    rest = order[max(1, math.ceil(tail * n)) if n else 0 :]
    picks = list(range(n))
    for j in range(0, len(rest), band):
        slots = rest[j : j + band]
        for k, i in zip(slots, rng.integers(0, len(slots), len(slots)), strict=True):
            picks[k] = slots[int(i)]
    return _sample(wl, picks, f"bootstrap stratified by length (seed {seed})")
