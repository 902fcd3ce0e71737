"""The most any sound early-stop rule could save, for ``benchmarks/tuning_quality.py``
(docs/tuning.md#10-early-stop-inside-a-level).

A rule that stops a level only when its verdict is certain, and reasons only about requests
already sent, counts nothing but requests that do break a limit in the full replay; so it can
stop no earlier than the send time of the k-th such request (in send order), where k is what
the limit needs over the whole level: ``needed(n)`` successes over a latency SLO, or one
request beyond the over-length allowance (the simulator's only failures are over-length).
This module measures that *oracle* stop on every level of a study run with early stop off
(the full replay is known then) by wrapping the in-process simulator the ``sim-virtual``
runner calls, and sums, per study:

- ``full_s``: engine seconds replayed (warm-ups excluded), every level to its end;
- ``oracle_s``: the same with every level that breaks a limit cut at its oracle stop.

``1 - oracle_s / full_s`` is the oracle saving: the ceiling for the product's rule on the same
trials, tighter than "every infeasible level stopped at once" because no rule can count a
request before it is sent. Benchmark-only: the product's rule is
``autotune.sim.SimWatch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import autotune.sim.replay as replay
import autotune.tuning.run.create as create
import autotune.tuning.run.lane_loop as lane_loop
from autotune.config import StudyConfig
from autotune.loadgen.stop_rule import needed
from autotune.sim.result import SimResult

__all__ = ["OracleTally", "level_oracle", "oracle_replay"]


class OracleTally:
    """Engine seconds of a study's levels: as replayed to the end, and cut at their oracle
    stops."""

    def __init__(self) -> None:
        self.full_s = 0.0
        self.oracle_s = 0.0


def level_oracle(cfg: StudyConfig, res: SimResult) -> tuple[float, float | None]:
    """(engine seconds the level replayed, seconds from its first send to its oracle stop or
    None when the full replay breaks no limit)."""
    meas = [r for r in res.requests if not r.warmup]
    if not meas:
        return 0.0, None
    start = min(r.arrival for r in meas)
    full = res.end - start
    planned = len(meas)
    slo = cfg.slo
    events: list[float] = []  # candidate oracle stops (absolute engine times)

    over = sorted(
        r.arrival
        for r in meas
        if r.rejected or (not math.isnan(r.finish) and r.truncated)  # refused or cut short
    )
    # over-length: the rate is over planned requests, so the first request past the
    # allowance breaks the limit (a rate over it leaves at least allowance + 1 requests)
    if len(over) / planned > slo.max_overlength_rate:
        events.append(over[int(slo.max_overlength_rate * planned)])

    ok = [r for r in meas if not r.rejected and not math.isnan(r.finish)]
    if ok:
        arrival = np.array([r.arrival for r in ok])
        n_out = np.array([len(r.token_times) for r in ok])
        ttft = np.array([r.ttft for r in ok]) * 1000.0
        tpot = np.array(
            [
                (r.e2e - r.ttft) / (n - 1) if n > 1 else math.nan
                for r, n in zip(ok, n_out, strict=True)
            ]
        )
        k = needed(len(ok))
        for limit, x in ((slo.p99_ttft_ms, ttft), (slo.p99_tpot_ms, tpot * 1000.0)):
            x_ok = ~np.isnan(x)
            if limit is None or not x_ok.any():
                continue
            if float(np.percentile(x[x_ok], 99)) > limit:
                over_at = np.sort(arrival[x_ok & (x > limit)])
                if len(over_at) >= k:
                    events.append(float(over_at[k - 1]))
    if not events:
        return full, None
    return full, max(min(events) - start, 0.0)


@contextmanager
def oracle_replay(cfg: StudyConfig) -> Iterator[OracleTally]:
    """Within the block, every level the ``sim-virtual`` runner simulates adds to the
    returned tally (run the study with ``strategy.early_stop: false``)."""
    tally = OracleTally()
    real: Callable[..., SimResult] = replay.simulate
    # the validation phase's runs and create's baseline capacity probe are no trial's
    # levels: the benchmark's replay figures sum the trials' levels only
    skipped = ((lane_loop, "run_validation"), (create, "baseline_capacity"))
    saved = {(module, name): getattr(module, name) for module, name in skipped}
    in_other = False

    def outside_trials(fn: Callable[..., Any]) -> Callable[..., Any]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal in_other
            in_other = True
            try:
                return await fn(*args, **kwargs)
            finally:
                in_other = False

        return run

    def wrapped(*args: Any, **kwargs: Any) -> SimResult:
        res = real(*args, **kwargs)
        if in_other:
            return res
        if res.stopped_at is not None:  # a watch that only observes never stops a level
            raise RuntimeError("the oracle needs full replays: run with early_stop false")
        full, cut = level_oracle(cfg, res)
        tally.full_s += full
        tally.oracle_s += full if cut is None else cut
        return res

    replay.simulate = wrapped  # type: ignore[assignment]
    for (module, name), fn in saved.items():
        setattr(module, name, outside_trials(fn))
    try:
        yield tally
    finally:
        replay.simulate = real  # type: ignore[assignment]
        for (module, name), fn in saved.items():
            setattr(module, name, fn)
