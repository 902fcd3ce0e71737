"""The simulated engine: startup accounting, then one event per engine step.

Each step: ``batch = scheduler.schedule()`` -> ``dt = cost(batch) x jitter`` -> tokens are
emitted at the step's end time (every token sampled in a step shares it) -> metrics sampled.
:func:`autotune.sim.virtual_loop.simulate` drives it on a virtual clock; the HTTP server's
driver (:mod:`autotune.sim.driver`) drives :class:`Engine` on a real clock.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.costs import CostModel
from autotune.sim.frontend import FrontEnd, FrontEndCosts, front_end_of
from autotune.sim.kvcache import block_hashes
from autotune.sim.memory import plan_memory
from autotune.sim.request import REJECTED, Req, RequestTiming, SimRequest
from autotune.sim.result import FloatArray, SimResult, Timeline
from autotune.sim.v1_scheduler import Scheduler, StepStats

__all__ = ["Engine", "context_length_error"]


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
        front_end: FrontEndCosts | None = None,
    ) -> None:
        # keep_history=False (the long-running HTTP server): no per-step timeline and no list
        # of finished requests, so memory stays flat; the server records what it needs.
        self.keep_history = keep_history
        self.model = model
        self.hardware = hardware
        self.args = args.resolve(model, hardware) if isinstance(args, EngineArgs) else args
        self.memory = plan_memory(model, hardware, self.args)
        # a calibrated profile's own constants come with it (autotune.sim.twin)
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
        # when each step's tokens reached the clients, after the API server's work
        # (autotune.sim.frontend); token times, TTFT and finish times use these
        self.front = FrontEnd(front_end if front_end is not None else front_end_of(hardware))
        self.step_out: list[float] = []
        self.last_out = 0.0
        self._out_work = 0.0  # the output loop's work on the last step's tokens
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

    def admit(self, arrival: float, prompt_len: int) -> float:
        """When a request arriving at ``arrival`` reaches the engine core, after the API
        server has tokenized it (queueing behind its backlog); add it then."""
        return self.front.admit(arrival, prompt_len)

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
        """Run one engine step starting at ``now``; returns (end time, batch stats).
        :attr:`last_out` is when the step's tokens reached the clients."""
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
        share = self.front.costs.engine_share
        if share > 0.0:
            # the API server streams the last step's tokens on the engine core's CPU while
            # the forward pass runs elsewhere: the step's CPU part waits for that share of it
            # (docs/simulator.md#34-the-api-server)
            dt = max(dt, self.cost.step_overhead + share * self._out_work)
            self._out_work = self.front.output_work(st.num_sampled)
        end = now + dt * self._jitter()
        sched.complete(s)
        self.step_idx = s + 1
        self.last_out = self.front.deliver(end, st.num_sampled)
        if not self.keep_history:
            return end, st
        self.step_start.append(now)
        self.step_end.append(end)
        self.step_out.append(self.last_out)
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
        e = np.asarray(self.step_out) if ends is None else ends
        segs = r.segs
        if len(segs) == 2:
            return e[segs[0] : segs[1]]
        parts = [e[segs[i] : segs[i + 1]] for i in range(0, len(segs), 2)]
        return np.concatenate(parts) if parts else np.empty(0)

    def result(self) -> SimResult:
        ends = np.asarray(self.step_out, dtype=np.float64)
        core = np.asarray(self.step_end, dtype=np.float64)  # the engine core's (ends: delivered)
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
                    engine_token_times=self.token_times(r, core),
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
            t=np.asarray(self.step_end, dtype=np.float64),
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
