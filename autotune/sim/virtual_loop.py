"""The simulated engine on a virtual clock: a replay runs as fast as the CPU allows.

:func:`simulate` replays requests open loop (at their arrival times) or closed loop (a fixed
concurrency), after optional warm-up requests, and asks a ``stop`` hook between steps
(:class:`autotune.sim.stop_watch.SimWatch` is one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.engine import Engine
from autotune.sim.request import Req, SimRequest
from autotune.sim.result import SimResult

__all__ = ["StopHook", "simulate"]

# asked between steps with the engine and its clock; True ends the replay (simulate's stop)
StopHook = Callable[["Engine", float], bool]


def simulate(
    model: ModelProfile,
    hardware: HardwareProfile,
    args: EngineArgs | ResolvedArgs,
    requests: Sequence[SimRequest],
    *,
    seed: int = 0,
    jitter_cv: float = 0.015,
    exact: bool = False,
    concurrency: int | None = None,
    warmup: Sequence[SimRequest] = (),
    stop: StopHook | None = None,
) -> SimResult:
    """Run ``requests`` to completion on a virtual clock. Raises ``SimStartupError`` when the
    engine args would make vLLM fail at startup.

    ``concurrency`` replays a closed loop instead: arrival times are ignored, ``concurrency``
    requests start at t=0 and each finished (or rejected) request is replaced, in order, by
    the next one at the end of the step that finished it (what a closed-loop client sees).

    ``warmup`` requests are sent all at once first and run to completion; the measured
    requests' clock starts when the last one finishes (``result.requests`` holds both).

    ``stop(engine, now)`` is asked between steps, once the requests that arrived by ``now``
    are queued; True ends the replay there, the requests not finished by then left
    unfinished (``result.stopped_at``; the steps never run cost nothing).
    """
    eng = Engine(model, hardware, args, seed=seed, jitter_cv=jitter_cv, exact=exact)
    start = _warm_up(eng, warmup) if warmup else 0.0
    if concurrency is not None:
        return _closed_loop(eng, requests, concurrency, start, stop)
    order = sorted(requests, key=lambda q: q.arrival)
    if start:
        order = [replace(q, arrival=q.arrival + start) for q in order]
    n, i, now = len(order), 0, start
    sched = eng.sched
    while i < n or sched.has_work:
        if not sched.has_work:
            now = max(now, order[i].arrival)
        # vLLM's engine core takes new requests between steps
        while i < n and order[i].arrival <= now:
            eng.add(order[i], user=order[i])
            i += 1
        if stop is not None and stop(eng, now):
            return _ended(eng, now, now)
        if sched.has_work:
            now, _ = eng.step(now)
    return _ended(eng, now, None)


def _ended(eng: Engine, now: float, stopped_at: float | None) -> SimResult:
    res = eng.result()
    res.end, res.stopped_at = now, stopped_at
    return res


def _warm_up(eng: Engine, warmup: Sequence[SimRequest]) -> float:
    """Run ``warmup`` (all sent at t=0) to completion; returns the time the last finished."""
    now = 0.0
    for q in warmup:
        eng.add(replace(q, arrival=0.0), user=q)
    while eng.sched.has_work:
        now, _ = eng.step(now)
    return now


def _closed_loop(
    eng: Engine,
    requests: Sequence[SimRequest],
    concurrency: int,
    start: float = 0.0,
    stop: StopHook | None = None,
) -> SimResult:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    sched = eng.sched
    pending = list(requests)
    i, now, in_flight = 0, start, 0
    while i < len(pending) or sched.has_work:
        while i < len(pending) and in_flight < concurrency:
            r = eng.add(replace(pending[i], arrival=now), user=pending[i])
            i += 1
            if isinstance(r, Req):
                in_flight += 1
        if stop is not None and stop(eng, now):
            return _ended(eng, now, now)
        if not sched.has_work:
            continue  # everything offered so far was rejected
        now, _ = eng.step(now)
        in_flight -= len(sched.finished)
    return _ended(eng, now, None)
