"""The simulated server's engine driver: one asyncio task runs the engine on a real clock.

It takes the requests that arrived, runs a step, sleeps until the step's end (engine time /
time scale) and then hands every request, once, what that step delivered to it: its new
tokens, and a finish reason with the last. HTTP handlers (:mod:`autotune.sim.routes`) only
queue requests and read their stream's queue, so the engine sees arrivals between steps
exactly as vLLM's engine core does. The driver also records ``/metrics``, the request log and
vLLM's periodic stats line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any

from autotune.sim.clock import RealClock
from autotune.sim.engine import Engine
from autotune.sim.exposition import VllmMetrics
from autotune.sim.request import FINISHED, Req, SimRequest
from autotune.sim.wire import ENGINE_DEAD

__all__ = ["EngineDriver", "Stream", "metrics_for"]

log = logging.getLogger(__name__)

# How far behind its previous step's end a busy engine may wake and still start its next step
# there (engine seconds): this process's own wake-up lag is not the modelled engine's, and
# a longer one is this host starving the server (docs/simulator.md#5-metrics-and-logs).
CATCH_UP_S = 0.02

# What a stream's queue carries per step: the new token ids and the finish reason
# (None while the request runs; "error" when the engine died).
Delivery = tuple[list[int], str | None]


@dataclass
class Stream:
    """One HTTP request's view of its engine request."""

    request_id: str
    arrival: float
    ready: float  # engine time the API server hands it to the engine (autotune.sim.frontend)
    prompt_ids: list[int]
    max_tokens: int
    rng: random.Random
    queue: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    req: Req | None = None
    delivered: int = 0
    scheduled: float = -1.0
    first_token: float = -1.0
    first_chunk: float = -1.0  # engine time the handler wrote its first chunk with choices
    last_token: float = -1.0
    token_times: list[float] = field(default_factory=list)
    # the same two instants on the engine core's clock, before the API server's delivery:
    # vLLM times its prefill, decode and inter-token histograms with these
    core_first: float = -1.0
    core_last: float = -1.0


def metrics_for(engine: Engine, served_model_name: str) -> VllmMetrics:
    """The ``/metrics`` families of ``engine``, its cache config in ``cache_config_info``."""
    args = engine.args
    mem = engine.memory
    return VllmMetrics(
        served_model_name,
        args.max_model_len,
        {
            "block_size": str(args.block_size),
            "num_gpu_blocks": str(mem.num_blocks),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "kv_cache_size_tokens": str(mem.kv_tokens),
            "kv_cache_max_concurrency": str(float(mem.max_concurrency)),
            "enable_prefix_caching": str(args.enable_prefix_caching),
            "kv_cache_memory_bytes": str(args.kv_cache_memory_bytes),
        },
    )


class EngineDriver:
    """Runs ``engine`` on ``clock`` for the HTTP handlers, recording into ``metrics``."""

    def __init__(
        self,
        engine: Engine,
        clock: RealClock,
        metrics: VllmMetrics,
        *,
        seed: int = 0,
        request_log: IO[str] | None = None,
        stats_interval: float = 10.0,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self.seed = seed
        self.request_log = request_log
        self.stats_interval = stats_interval
        self._pending: list[Stream] = []
        self._aborts: list[Stream] = []
        self._live: dict[Req, Stream] = {}
        self._wake = asyncio.Event()
        self._n = 0
        self._loop_task: asyncio.Task[None] | None = None
        # deliveries waiting for their time (timers; finished ones are dropped as they go)
        self._handing: set[asyncio.TimerHandle] = set()
        self._stats_task: asyncio.Task[None] | None = None
        self._window = [0, 0]  # prompt / generation tokens since the last stats line
        self._last_end = 0.0  # engine time the previous step ended
        self.engine_error: BaseException | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._engine_loop(), name="sim-engine")
        if self.stats_interval > 0:
            self._stats_task = asyncio.create_task(self._stats_loop(), name="sim-stats")

    async def stop(self) -> None:
        for h in self._handing:
            h.cancel()
        self._handing.clear()
        for t in (self._loop_task, self._stats_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def fail_engine(self) -> None:
        """The simulated EngineCore dies while the API server stays up, as when vLLM's
        EngineCore process is killed: vLLM's lines are logged and every stream in flight
        is handed an error."""
        if self.engine_error is not None:
            return
        self.engine_error = RuntimeError(ENGINE_DEAD)
        log.error(
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client. "
            "(simulated fault)"
        )
        log.error("AsyncLLM output_handler failed.")
        log.error("vllm.v1.engine.exceptions.EngineDeadError: %s", ENGINE_DEAD)
        if self._loop_task is not None:
            self._loop_task.cancel()
        for s in [*self._live.values(), *self._pending]:
            s.queue.put_nowait(([], "error"))
        self._live.clear()
        self._pending.clear()

    # -- requests ------------------------------------------------------------------
    def submit(self, ids: list[int], max_tokens: int, request_id: str | None) -> Stream:
        self._n += 1
        now = self.clock.now()
        s = Stream(
            request_id=request_id or uuid.uuid4().hex,
            arrival=now,
            ready=self.engine.admit(now, len(ids)),
            prompt_ids=ids,
            max_tokens=max_tokens,
            rng=random.Random(self.seed * 1_000_003 + self._n),
        )
        self._pending.append(s)
        self._wake.set()
        return s

    def abort(self, s: Stream) -> None:
        self._aborts.append(s)
        self._wake.set()

    # -- the engine task -----------------------------------------------------------
    async def _engine_loop(self) -> None:
        eng = self.engine
        sched = eng.sched
        caching = eng.args.enable_prefix_caching
        try:
            while True:
                if not sched.has_work and not self._pending and not self._aborts:
                    self._wake.clear()
                    await self._wake.wait()
                for s in self._aborts:
                    if s.req is not None:
                        sched.abort(s.req, eng.step_idx)
                        self._live.pop(s.req, None)
                    elif s in self._pending:
                        self._pending.remove(s)
                self._aborts.clear()
                now = self.clock.now()
                if sched.has_work and now - self._last_end < CATCH_UP_S:
                    # the next step starts where the last one ended (CATCH_UP_S)
                    now = self._last_end
                ready = [s for s in self._pending if s.ready <= now]
                for s in ready:
                    sr = SimRequest(
                        len(s.prompt_ids),
                        s.max_tokens,
                        s.arrival,
                        prompt_token_ids=s.prompt_ids if caching else None,
                    )
                    r = eng.add(sr, user=s)
                    assert isinstance(r, Req)  # lengths were checked in the handler
                    s.req = r
                    self._live[r] = s
                self._pending = [s for s in self._pending if s.ready > now]
                if not sched.has_work:
                    if self._pending:  # still being tokenized by the API server
                        await self._sleep_or_wake(min(s.ready for s in self._pending))
                    continue
                pre0, q0, h0 = sched.num_preemptions, sched.prefix_queries, sched.prefix_hits
                end, st = eng.step(now)
                step: dict[str, Any] = {
                    "iteration_tokens": st.num_tokens,
                    "generation_tokens": st.num_sampled,
                    "running": len(sched.running),
                    "waiting": len(sched.waiting),
                    "kv_usage": sched.kv.usage,
                    "preemptions": sched.num_preemptions - pre0,
                    "prefix_queries": sched.prefix_queries - q0,
                    "prefix_hits": sched.prefix_hits - h0,
                }
                self._last_end = end
                await self.clock.sleep_until(end)
                # vLLM counts a request's whole prompt, cached tokens included, in the step
                # that emits its first token (tests/data/captures/prompt_tokens_cached.txt)
                prompt_tokens = self._deliver(now, end, eng.last_out)
                self.metrics.observe_step(prompt_tokens=prompt_tokens, **step)
                self._window[0] += prompt_tokens
                self._window[1] += st.num_sampled
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine bug: fail every stream, /health turns 500
            self.engine_error = exc
            log.exception("simulated engine died")
            for s in self._live.values():
                s.queue.put_nowait(([], "error"))
            raise

    async def _sleep_or_wake(self, until: float) -> None:
        """Sleep until engine time ``until``, or until a new request or abort comes."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            delay = (until - self.clock.now()) / self.clock.scale
            await asyncio.wait_for(self._wake.wait(), max(0.0, delay))

    def _deliver(self, step_start: float, core_end: float, end: float) -> int:
        """Hand every stream its new tokens at ``end``, when the API server has processed
        the step that ended at ``core_end`` (the engine core runs on meanwhile); returns the
        prompt tokens (whole prompts) of the requests whose first token this step emitted."""
        sched = self.engine.sched
        nxt = self.engine.step_idx
        vocab = self.engine.model.vocab_size
        gaps: list[float] = []
        live = [
            (r, s)
            for r in [*sched.running, *sched.finished]
            if (s := self._live.get(r)) is not None
        ]
        # Every token of a step carries the same time; hand first tokens out first. Handlers
        # wake in queue order, so a new stream would otherwise wait behind every running
        # stream's write, inflating the TTFT a client measures at high concurrency.
        live.sort(key=lambda rs: rs[1].first_token >= 0)
        first_prompts = 0
        puts: list[tuple[Stream, Delivery]] = []
        for r, s in live:
            if s.scheduled < 0 and r.t_sched >= 0:
                s.scheduled = step_start
            n = r.outputs_at(nxt)
            new = n - s.delivered
            if new <= 0:
                continue
            if s.first_token < 0:
                s.first_token, s.core_first = end, core_end
                first_prompts += len(s.prompt_ids)
            else:
                gaps.append(core_end - s.core_last)
            s.last_token, s.core_last = end, core_end
            s.token_times.append(end)
            s.delivered = n
            done = r.status == FINISHED
            puts.append(
                (s, ([s.rng.randrange(vocab) for _ in range(new)], "length" if done else None))
            )
            if done:
                self._finished(r, s, end, core_end)
        if gaps:
            self.metrics.observe_itl(gaps)
        if end > self.clock.now():  # the API server is still detokenizing the step
            # a timer, not a task that spins to the microsecond as the engine's own sleep
            # does: a second spinner per step would take the CPU the server needs
            loop = asyncio.get_running_loop()
            self._handing = {h for h in self._handing if h.when() > loop.time()}
            self._handing.add(loop.call_at(self.clock.wall_at(end), self._hand_out, puts))
        else:
            self._hand_out(puts)
        return first_prompts

    def _hand_out(self, puts: list[tuple[Stream, Delivery]]) -> None:
        for s, d in puts:
            s.queue.put_nowait(d)

    def _finished(self, r: Req, s: Stream, end: float, core_end: float) -> None:
        del self._live[r]
        self.metrics.observe_finished(
            finished_reason="length",
            prompt_tokens=len(s.prompt_ids),
            generation_tokens=s.delivered,
            max_tokens=s.max_tokens,
            n=1,
            arrival=s.arrival,
            scheduled=s.scheduled,
            first_token=s.first_token,
            finish=end,
            core_first_token=s.core_first,
            core_finish=core_end,
            num_preemptions=r.preemptions,
            prefill_computed_tokens=len(s.prompt_ids) - r.cached,
            cached_prompt_tokens=r.cached,
        )
        if self.request_log is not None:
            self.request_log.write(
                json.dumps(
                    {
                        "request_id": s.request_id,
                        "arrival": s.arrival,
                        "scheduled": s.scheduled,
                        "first_token": s.first_token,
                        # None when the handler had not written it yet (one-token outputs)
                        "first_chunk": s.first_chunk if s.first_chunk >= 0 else None,
                        "finish": end,
                        "prompt_tokens": len(s.prompt_ids),
                        "output_tokens": s.delivered,
                        "preemptions": r.preemptions,
                        "cached_tokens": r.cached,
                        "token_times": s.token_times,
                        "time_scale": self.clock.scale,
                    }
                )
                + "\n"
            )
            self.request_log.flush()

    async def _stats_loop(self) -> None:
        """vLLM's periodic stats line (every 10 s on 0.32), in wall seconds."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.stats_interval)
            now = time.monotonic()
            dt = max(now - last, 1e-9)
            last = now
            sched = self.engine.sched
            p, g = self._window
            self._window = [0, 0]
            hit = 100.0 * sched.prefix_hits / sched.prefix_queries if sched.prefix_queries else 0.0
            log.info(
                "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput:"
                " %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: "
                "%.1f%%, Prefix cache hit rate: %.1f%%",
                p / dt,
                g / dt,
                len(sched.running),
                len(sched.waiting),
                100 * sched.kv.usage,
                hit,
            )
