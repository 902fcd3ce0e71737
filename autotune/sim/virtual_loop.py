"""The simulated engine on a virtual clock: a replay runs as fast as the CPU allows.

:func:`simulate` replays requests open loop (at their arrival times) or closed loop (a fixed
concurrency), after optional warm-up requests, and asks a ``stop`` hook between steps
(:class:`autotune.sim.stop_watch.SimWatch` is one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.engine import Engine
from autotune.sim.frontend import FrontEndCosts
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
    front_end: FrontEndCosts | None = None,
) -> SimResult:
    """Run ``requests`` to completion on a virtual clock. Raises ``SimStartupError`` when the
    engine args would make vLLM fail at startup.

    ``concurrency`` replays a closed loop instead: arrival times are ignored, ``concurrency``
    requests start at t=0 and each finished (or rejected) request is replaced, in order, by
    the next one when its last token reached the client (what a closed-loop client sees).

    ``front_end`` is the API server's work (:mod:`autotune.sim.frontend`): a request reaches
    the engine once tokenized, and a step's tokens reach the clients once detokenized. None:
    the hardware profile's (a calibrated profile's fitted costs, else the defaults).

    ``warmup`` requests are sent all at once first and run to completion; the measured
    requests' clock starts when the last one finishes (``result.requests`` holds both).

    ``stop(engine, now)`` is asked between steps, once the requests that arrived by ``now``
    are queued; True ends the replay there, the requests not finished by then left
    unfinished (``result.stopped_at``; the steps never run cost nothing).
    """
    eng = Engine(
        model,
        hardware,
        args,
        seed=seed,
        jitter_cv=jitter_cv,
        exact=exact,
        front_end=front_end,
    )
    start = _warm_up(eng, warmup) if warmup else 0.0
    if concurrency is not None:
        return _closed_loop(eng, requests, concurrency, start, stop)
    order = sorted(requests, key=lambda q: q.arrival)
    if start:
        order = [replace(q, arrival=q.arrival + start) for q in order]
    n, now = len(order), start
    sched = eng.sched
    # requests the API server has taken (in arrival order) and when each reaches the engine
    admitted: deque[tuple[float, SimRequest]] = deque()
    nxt = 0

    def arrive(until: float) -> None:
        nonlocal nxt
        while nxt < n and order[nxt].arrival <= until:
            q = order[nxt]
            admitted.append((eng.admit(q.arrival, q.prompt_len), q))
            nxt += 1

    while nxt < n or admitted or sched.has_work:
        arrive(now)
        if not sched.has_work and not (admitted and admitted[0][0] <= now):
            now = max(now, admitted[0][0] if admitted else order[nxt].arrival)
            continue
        # vLLM's engine core takes new requests between steps
        while admitted and admitted[0][0] <= now:
            q = admitted.popleft()[1]
            eng.add(q, user=q)
        if stop is not None and stop(eng, now):
            return _ended(eng, now, now)
        if sched.has_work:
            now, _ = eng.step(now)
    return _ended(eng, now, None)


def _ended(eng: Engine, now: float, stopped_at: float | None) -> SimResult:
    res = eng.result()
    # a finished replay ends when its last token reached the client, after the API server
    res.end = now if stopped_at is not None else max(now, eng.last_out)
    res.stopped_at = stopped_at
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
    now, i = start, 0
    # sent but still in the API server: (reaches the engine, as sent, as given)
    admitted: deque[tuple[float, SimRequest, SimRequest]] = deque()

    def send(t: float) -> None:
        """A client sends the next request at ``t``."""
        nonlocal i
        if i < len(pending):
            q = replace(pending[i], arrival=t)
            admitted.append((eng.admit(t, q.prompt_len), q, pending[i]))
            i += 1

    for _ in range(concurrency):
        send(start)
    while admitted or sched.has_work:
        if not sched.has_work and admitted[0][0] > now:
            now = admitted[0][0]
        while admitted and admitted[0][0] <= now:
            ready, q, given = admitted.popleft()
            if not isinstance(eng.add(q, user=given), Req):
                send(ready)  # rejected: its client hears so and sends the next one
        if stop is not None and stop(eng, now):
            return _ended(eng, now, now)
        if not sched.has_work:
            continue  # everything offered so far was rejected
        now, _ = eng.step(now)
        # a client sends its next request once its last token reached it
        for _ in sched.finished:
            send(eng.last_out)
    return _ended(eng, now, None)
