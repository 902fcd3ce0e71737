"""Early stop for the in-process simulator: the ``stop`` hook
:func:`autotune.sim.virtual_loop.simulate` asks between steps, counting what the replay
already knows (docs/tuning.md#10-early-stop-inside-a-level). It walks the engine's own
state, so it lives beside the engine (docs/architecture.md); the rule comes from the study
(:func:`autotune.tuning.measure.early_stop.rule_of`).

The counts are incremental, so a step costs O(1) amortized: requests are walked in arrival
order (the engine queues them so, open and closed loop alike), and a request is classified
once its age exceeds the TTFT SLO. At that moment its TTFT is final: either its first token
came by then (and is known), or it comes at a later step's end, which makes it exceed.

TPOT is ``(finish - first) / (n - 1)`` and the simulator knows ``n`` up front (its output
length, cut to ``max_model_len``: nothing else ends a request early), so a request still
decoding at ``now`` already has ``TPOT > (now - first) / (n - 1)``; once that bound exceeds
the SLO, the request counts (checked every few steps).
"""

from __future__ import annotations

from itertools import chain

from autotune.loadgen.stop_rule import StopRule, Tally
from autotune.sim.engine import Engine
from autotune.sim.request import Req, SimRequest

__all__ = ["SimWatch", "tpot_bound"]


def _warm(user: object) -> bool:
    return isinstance(user, SimRequest) and user.warmup


class SimWatch:
    """A :data:`autotune.sim.virtual_loop.StopHook` for one level of ``planned`` measured
    requests (warm-ups, marked by :attr:`SimRequest.warmup`, are not counted). ``observe``:
    never stop; only note where the rule would have (:attr:`reason`, :attr:`arrived`), so
    that a level replayed to its end tells the sampler what a stopped one would
    (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees")."""

    def __init__(
        self, rule: StopRule, planned: int, warmups: int = 0, *, observe: bool = False
    ) -> None:
        self.rule = rule
        self.observe = observe
        self.tally = Tally(planned)
        self.warmups = warmups
        self.reason: str | None = None
        self.arrived = 0  # measured requests queued or rejected by the stop
        self._p = 0  # eng.reqs walked by the TTFT age
        self._rej = 0  # eng.rejected seen
        self._step = -1  # the step whose finished requests were counted
        self.tpot_marked: set[int] = set()  # unfinished requests whose TPOT bound exceeds
        self.tpot_bounds: list[float] = []  # at the stop: every unfinished request's bound

    def __call__(self, eng: Engine, now: float) -> bool:
        if self.observe and self.reason is not None:  # past the point: nothing more to note
            return False
        t, rule = self.tally, self.rule
        while self._rej < len(eng.rejected):  # over-length 400s, known at arrival
            sr = eng.rejected[self._rej][0]
            self._rej += 1
            if not _warm(sr):
                t.failed += 1
                t.over_length += 1
        ends = eng.step_out  # when tokens reached the clients (autotune.sim.frontend)
        if eng.step_idx != self._step:
            self._step = eng.step_idx
            for r in eng.sched.finished:
                if not _warm(r.user):
                    self._finished(r, ends)
        if rule.p99_tpot_ms is not None and eng.step_idx % _TPOT_EVERY == 0:
            for r in chain(eng.sched.running, eng.sched.waiting):
                if r.idx in self.tpot_marked or _warm(r.user):
                    continue
                b = tpot_bound(r, ends, now)
                if b is not None and rule.exceeds_tpot(b):
                    self.tpot_marked.add(r.idx)
                    t.tpot_over += 1
        ttft = rule.p99_ttft_ms
        if ttft is not None:
            reqs = eng.reqs
            while self._p < len(reqs):
                r = reqs[self._p]
                if not (now - r.arrival) * 1000.0 > ttft:
                    break  # younger, and so is every later arrival
                self._p += 1
                if not _warm(r.user) and (
                    r.t_first < 0 or rule.exceeds_ttft(ends[r.t_first] - r.arrival)
                ):
                    t.ttft_over += 1
        self.reason = rule.verdict(t)
        if self.reason is not None:
            self.arrived = len(eng.reqs) + len(eng.rejected) - self.warmups
            unfinished = chain(eng.sched.running, eng.sched.waiting)
            bounds = (tpot_bound(r, ends, now) for r in unfinished if not _warm(r.user))
            self.tpot_bounds = [b for b in bounds if b is not None]
        return self.reason is not None and not self.observe

    def _finished(self, r: Req, ends: list[float]) -> None:
        asked = r.user.output_len if isinstance(r.user, SimRequest) else r.max_tokens
        if r.max_tokens < asked:
            self.tally.over_length += 1  # truncated by max_model_len
        segs = r.segs
        n = sum(segs[i + 1] - segs[i] for i in range(0, len(segs), 2))
        if n > 1 and r.idx not in self.tpot_marked:  # a marked one was counted already
            # the record's TPOT, with the same float operations: (e2e - ttft) / (n - 1)
            first, finish = ends[r.t_first], ends[r.t_finish]
            tpot = ((finish - r.arrival) - (first - r.arrival)) / (n - 1)
            if self.rule.exceeds_tpot(tpot):
                self.tally.tpot_over += 1


_TPOT_EVERY = 8  # steps between checks of the unfinished requests' TPOT bounds


def tpot_bound(r: Req, ends: list[float], now: float) -> float | None:
    """A lower bound of the TPOT of a request unfinished at ``now`` (it finishes later),
    with the record's float operations; None before its first token or for one token."""
    if r.t_first < 0 or r.max_tokens < 2:
        return None
    first = ends[r.t_first]
    return ((now - r.arrival) - (first - r.arrival)) / (r.max_tokens - 1)
