"""The simulated engine: startup accounting, then one event per engine step.

Each step: ``batch = scheduler.schedule()`` -> ``dt = cost(batch) x jitter`` -> tokens are
emitted at the step's end time (every token sampled in a step shares it) -> metrics sampled.
:func:`simulate` drives it on a virtual clock; the HTTP server drives :class:`Engine` on a
real clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.costs import CostModel
from autotune.sim.kvcache import block_hashes
from autotune.sim.memory import MemoryPlan, plan_memory
from autotune.sim.request import REJECTED, Req, RequestTiming, SimRequest
from autotune.sim.scheduler import Scheduler, StepStats

__all__ = [
    "Engine",
    "SimResult",
    "StopHook",
    "Timeline",
    "context_length_error",
    "simulate",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class Timeline:
    """Per-step samples of what vLLM exports as metrics (arrays of equal length)."""

    t: FloatArray  # step end time
    running: IntArray  # vllm:num_requests_running
    waiting: IntArray  # vllm:num_requests_waiting
    kv_usage: FloatArray  # vllm:kv_cache_usage_perc (0-1)
    preemptions: IntArray  # vllm:num_preemptions_total (cumulative)
    tokens: IntArray  # vllm:iteration_tokens_total observations
    prefill_tokens: IntArray
    decode_tokens: IntArray


@dataclass
class SimResult:
    requests: list[RequestTiming]
    timeline: Timeline
    memory: MemoryPlan
    args: ResolvedArgs
    num_steps: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    end: float = 0.0  # engine clock when the replay ended (the last step's end, or the stop)
    stopped_at: float | None = None  # the ``stop`` hook ended it here (requests unfinished)

    @property
    def num_preemptions(self) -> int:
        return int(self.timeline.preemptions[-1]) if len(self.timeline.preemptions) else 0

    def summary(self) -> dict[str, float | int]:
        """Headline figures, in ``vllm bench serve``'s units (ms, per second)."""
        done = [r for r in self.requests if not r.rejected]
        out: dict[str, float | int] = {
            "completed": len(done),
            "rejected": len(self.requests) - len(done),
            "num_preemptions": self.num_preemptions,
            "num_steps": self.num_steps,
        }
        if not done:
            return out
        start = min(r.arrival for r in done)
        duration = max(r.finish for r in done) - start
        ttft = np.array([r.ttft for r in done]) * 1e3
        tpot = np.array([r.tpot for r in done if r.output_len > 1] or [0.0]) * 1e3
        out_tokens = sum(r.output_len for r in done)
        out.update(
            duration_s=duration,
            request_throughput=len(done) / duration if duration > 0 else 0.0,
            output_throughput=out_tokens / duration if duration > 0 else 0.0,
            mean_ttft_ms=float(ttft.mean()),
            median_ttft_ms=float(np.percentile(ttft, 50)),
            p99_ttft_ms=float(np.percentile(ttft, 99)),
            mean_tpot_ms=float(tpot.mean()),
            p99_tpot_ms=float(np.percentile(tpot, 99)),
        )
        return out


def context_length_error(
    max_model_len: int, prompt: int, *, at_least: bool = False
) -> tuple[str, str] | None:
    """vLLM 0.32's 400 for a prompt that leaves no room for output, as (message, param), or
    None when the prompt fits (prompt + max_tokens beyond max_model_len is NOT an error: vLLM
    cuts max_tokens to ``max_model_len - prompt``). Texts as captured from real vLLM 0.32
    (tests/data/vllm032); ``at_least``: text prompts, which vLLM tokenizes only up to
    ``max_model_len + 1`` tokens."""
    if prompt > max_model_len:
        n = max_model_len + 1 if at_least else prompt
        count = f"at least {n}" if at_least else str(n)
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {count} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={n})",
            "input_tokens",
        )
    if prompt == max_model_len:
        return (
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
            "max_tokens",
        )
    return None


class Engine:
    """Startup (memory accounting; raises ``SimStartupError`` like vLLM) plus the step loop."""

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        args: EngineArgs | ResolvedArgs,
        *,
        seed: int = 0,
        jitter_cv: float = 0.015,
        exact: bool = False,
        keep_history: bool = True,
    ) -> None:
        # keep_history=False (the long-running HTTP server): no per-step timeline and no list
        # of finished requests, so memory stays flat; the server records what it needs.
        self.keep_history = keep_history
        self.model = model
        self.hardware = hardware
        self.args = args.resolve(model, hardware) if isinstance(args, EngineArgs) else args
        self.memory = plan_memory(model, hardware, self.args)
        self.cost = CostModel.build(model, hardware, tp=self.args.tensor_parallel_size)
        # one block is vLLM's null block: never handed to a request
        self.sched = Scheduler(self.args, self.memory.num_blocks - 1, exact=exact)
        if jitter_cv < 0:
            raise ValueError("jitter_cv must be >= 0")
        self._cv = jitter_cv
        self._rng = np.random.default_rng(seed)
        self._jit: list[float] = []
        self._jit_i = 0
        self.step_idx = 0
        self.step_start: list[float] = []
        self.step_end: list[float] = []
        self._tl: tuple[
            list[int], list[int], list[float], list[int], list[int], list[int], list[int]
        ] = ([], [], [], [], [], [], [])
        self.reqs: list[Req] = []
        self._n_added = 0
        self.rejected: list[tuple[SimRequest, str]] = []

    # -- requests ------------------------------------------------------------------
    def add(self, sr: SimRequest, user: object = None) -> Req | str:
        """Queue a request. A prompt of ``max_model_len`` tokens or more is rejected (vLLM's
        400; its text is returned instead); a longer output is cut to fit, as vLLM does."""
        mml = self.args.max_model_len
        err = context_length_error(mml, sr.prompt_len)
        if err is not None:
            self.rejected.append((sr, err[0]))
            return err[0]
        if sr.prompt_len + sr.output_len > mml:
            sr = replace(sr, output_len=mml - sr.prompt_len)
        hashes = (
            block_hashes(sr.prompt_token_ids, self.args.block_size)
            if sr.prompt_token_ids is not None and self.args.enable_prefix_caching
            else []
        )
        r = Req(self._n_added, sr.prompt_len, sr.output_len, sr.arrival, hashes, user)
        self._n_added += 1
        if self.keep_history:
            self.reqs.append(r)
        self.sched.add(r)
        return r

    # -- stepping ------------------------------------------------------------------
    def _jitter(self) -> float:
        if self._cv == 0:
            return 1.0
        if self._jit_i >= len(self._jit):
            cv = self._cv
            z = self._rng.standard_normal(4096)
            self._jit = np.exp(cv * z - cv * cv / 2).tolist()  # mean 1
            self._jit_i = 0
        self._jit_i += 1
        return self._jit[self._jit_i - 1]

    def step(self, now: float) -> tuple[float, StepStats]:
        """Run one engine step starting at ``now``; returns (end time, batch stats)."""
        s = self.step_idx
        sched = self.sched
        st = sched.schedule(s)
        if st.num_tokens == 0:
            raise RuntimeError(  # would loop forever; a scheduler bug, not a user error
                f"simulated engine scheduled nothing at step {s} "
                f"(running={len(sched.running)}, waiting={len(sched.waiting)}, "
                f"free_blocks={sched.kv.num_free})"
            )
        dt = self.cost.step_time(
            st.num_tokens, st.num_sampled, st.sum_decode_ctx, st.prefill_work, st.num_scheduled
        )
        end = now + dt * self._jitter()
        sched.complete(s)
        self.step_idx = s + 1
        if not self.keep_history:
            return end, st
        self.step_start.append(now)
        self.step_end.append(end)
        tl = self._tl
        tl[0].append(len(sched.running))
        tl[1].append(len(sched.waiting))
        tl[2].append(sched.kv.usage)
        tl[3].append(sched.num_preemptions)
        tl[4].append(st.num_tokens)
        tl[5].append(st.prefill_tokens)
        tl[6].append(st.decode_tokens)
        return end, st

    # -- results -------------------------------------------------------------------
    def token_times(self, r: Req, ends: FloatArray | None = None) -> FloatArray:
        e = np.asarray(self.step_end) if ends is None else ends
        segs = r.segs
        if len(segs) == 2:
            return e[segs[0] : segs[1]]
        parts = [e[segs[i] : segs[i + 1]] for i in range(0, len(segs), 2)]
        return np.concatenate(parts) if parts else np.empty(0)

    def result(self) -> SimResult:
        ends = np.asarray(self.step_end, dtype=np.float64)
        starts = self.step_start
        timings: list[RequestTiming] = []
        for r in self.reqs:
            if r.status == REJECTED:
                continue
            tt = self.token_times(r, ends)
            asked = r.user.output_len if isinstance(r.user, SimRequest) else r.max_tokens
            timings.append(
                RequestTiming(
                    request_id=_rid(r),
                    prompt_len=r.prompt_len,
                    output_len=r.output,
                    truncated=r.max_tokens < asked,
                    arrival=r.arrival,
                    scheduled=starts[r.t_sched] if r.t_sched >= 0 else math.nan,
                    first_token=float(ends[r.t_first]) if r.t_first >= 0 else math.nan,
                    finish=float(ends[r.t_finish]) if r.t_finish >= 0 else math.nan,
                    token_times=tt,
                    preemptions=r.preemptions,
                    warmup=isinstance(r.user, SimRequest) and r.user.warmup,
                )
            )
        for sr, msg in self.rejected:
            timings.append(
                RequestTiming(
                    request_id=sr.request_id or "",
                    prompt_len=sr.prompt_len,
                    output_len=0,
                    arrival=sr.arrival,
                    scheduled=math.nan,
                    first_token=math.nan,
                    finish=math.nan,
                    token_times=np.empty(0),
                    rejected=True,
                    reject_reason=msg,
                    warmup=sr.warmup,
                )
            )
        tl = self._tl
        timeline = Timeline(
            t=ends,
            running=np.asarray(tl[0], dtype=np.int64),
            waiting=np.asarray(tl[1], dtype=np.int64),
            kv_usage=np.asarray(tl[2], dtype=np.float64),
            preemptions=np.asarray(tl[3], dtype=np.int64),
            tokens=np.asarray(tl[4], dtype=np.int64),
            prefill_tokens=np.asarray(tl[5], dtype=np.int64),
            decode_tokens=np.asarray(tl[6], dtype=np.int64),
        )
        return SimResult(
            timings,
            timeline,
            self.memory,
            self.args,
            self.step_idx,
            self.sched.prefix_queries,
            self.sched.prefix_hits,
        )


def _rid(r: Req) -> str:
    u = r.user
    return u.request_id or f"req-{r.idx}" if isinstance(u, SimRequest) else f"req-{r.idx}"


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
