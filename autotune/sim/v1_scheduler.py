"""A port of vLLM V1's scheduler, ``vllm/v1/core/sched/scheduler.py``.

Semantics kept exactly (docs/vllm.md#3-the-v1-scheduler):
- one token budget (``max_num_batched_tokens``) per step; at most ``max_num_seqs`` running;
- RUNNING requests first, in list order: ``num_new = num_tokens - num_computed``, clamped by
  ``long_prefill_token_threshold``, the remaining budget and ``max_model_len - 1 - computed``;
- a failed block allocation preempts the *last* running request (recompute: its blocks are
  freed, ``num_computed_tokens = 0``, it goes to the front of WAITING); if the victim is the
  request itself the running loop stops;
- WAITING requests are admitted only in a step without preemption, while budget remains and
  fewer than ``max_num_seqs`` run; prefix-cache hits first; with chunked prefill off a prompt
  that does not fit the remaining budget stops admission; a failed allocation stops admission
  (head-of-line blocking);
- a request samples one token when its computed tokens reach its total; mid-prefill chunks
  sample nothing.

Speed comes from skipping work that provably cannot change the outcome, never from changing
semantics. A request that has caught up (one new token per step) is put in *decode mode*
(see :class:`~autotune.sim.request.Req`): it advances implicitly, and a step touches only the
requests that have an event in it (a new block to allocate, a prefill chunk, a finish). The
full V1 loop over every running request runs whenever the token budget could bind in an order
the fast path cannot see. ``exact=True`` runs that full loop every step; a test checks both
give identical results.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from autotune.sim.args import ResolvedArgs
from autotune.sim.kvcache import KVCache
from autotune.sim.request import FINISHED, RUNNING, WAITING, Req

__all__ = ["Scheduler", "StepStats"]


@dataclass(slots=True)
class StepStats:
    """Batch composition of one step: what the cost model and the metrics need."""

    num_tokens: int = 0
    num_sampled: int = 0
    sum_decode_ctx: int = 0
    prefill_work: float = 0.0
    num_scheduled: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preempted: int = 0


class Scheduler:
    def __init__(self, args: ResolvedArgs, num_blocks: int, *, exact: bool = False) -> None:
        self.bs = args.block_size
        self.mnbt = args.max_num_batched_tokens
        self.mns = args.max_num_seqs
        self.mml = args.max_model_len
        self.chunked = args.enable_chunked_prefill
        self.thr = args.long_prefill_token_threshold
        self.exact = exact
        self.kv = KVCache(num_blocks, args.enable_prefix_caching)
        self.running: dict[Req, None] = {}  # insertion order is vLLM's running-list order
        self.waiting: deque[Req] = deque()
        self.explicit: dict[Req, None] = {}  # running requests not in decode mode
        self._seq = 0
        # decode-mode bookkeeping
        self.n_dec = 0
        self._ctx_base = 0  # sum of (c0 - s0 + 1): decode context sum at step s = base + n_dec*s
        self._phase: list[dict[Req, None]] = [{} for _ in range(self.bs)]
        self._fin_heap: list[tuple[int, int, Req]] = []
        self._dmax: list[tuple[int, Req]] = []  # max seq among decode-mode requests (lazy heap)
        # counters (vLLM metric names in comments)
        self.num_preemptions = 0  # vllm:num_preemptions_total
        self.prefix_queries = 0  # vllm:prefix_cache_queries_total (tokens)
        self.prefix_hits = 0  # vllm:prefix_cache_hits_total (tokens)
        self.finished: list[Req] = []  # finished in the last completed step
        self.emitted: list[Req] = []  # explicit requests that sampled a token in the last step
        self._sched: list[tuple[Req, int]] = []
        self._preempted_now = False

    # -- queue entry ---------------------------------------------------------------
    def add(self, r: Req) -> None:
        r.status = WAITING
        self.waiting.append(r)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def decode_members(self) -> list[Req]:
        """Requests in decode mode (each samples one token in every scheduled step)."""
        return [r for bucket in self._phase for r in bucket]

    # -- helpers -------------------------------------------------------------------
    def _need(self, r: Req) -> int:
        n = r.prompt_len + r.output - r.computed
        if 0 < self.thr < n:
            n = self.thr
        return min(n, self.mml - 1 - r.computed)

    def _held(self, r: Req) -> int:
        return len(r.hashed) + r.anon

    def _enter_decode(self, r: Req, s0: int) -> None:
        del self.explicit[r]
        r.dec = True
        r.s0, r.c0, r.o0 = s0, r.computed, r.output
        self._phase[(s0 - r.computed) % self.bs][r] = None
        self._ctx_base += r.computed - s0 + 1
        self.n_dec += 1
        r.fin_step = s0 + r.max_tokens - r.output - 1
        heapq.heappush(self._fin_heap, (r.fin_step, r.seq, r))
        heapq.heappush(self._dmax, (-r.seq, r))

    def _leave_decode(self, r: Req, s: int) -> None:
        """Materialize a decode-mode request's state at the start of step ``s``."""
        k = s - r.s0
        r.computed = r.c0 + k
        r.output = r.o0 + k
        if k > 0:
            r.emit_range(r.s0, s)
        self._drop_decode(r)
        self.explicit[r] = None

    def _drop_decode(self, r: Req) -> None:
        """Take a request out of decode mode; ``r.computed`` must already be materialized
        (its blocks: exactly ``cdiv(computed, block_size)``)."""
        r.anon = -(-r.computed // self.bs) - len(r.hashed)
        del self._phase[(r.s0 - r.c0) % self.bs][r]
        self._ctx_base -= r.c0 - r.s0 + 1
        self.n_dec -= 1
        r.dec = False

    def _max_dec_seq(self) -> int:
        h = self._dmax
        while h and not (h[0][1].dec and h[0][1].seq == -h[0][0]):
            heapq.heappop(h)
        return -h[0][0] if h else -1

    def _preempt_last(self, s: int) -> Req:
        victim, _ = self.running.popitem()
        if victim.dec:
            self._leave_decode(victim, s)
        del self.explicit[victim]
        self.kv.free(victim.anon, victim.hashed)
        victim.anon = 0
        victim.hashed = []
        victim.computed = 0
        victim.preemptions += 1
        victim.status = WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        self._preempted_now = True
        return victim

    def _make_room(self, n: int, r: Req, s: int) -> bool:
        """Preempt from the tail until ``n`` blocks are free; False if ``r`` was the victim."""
        while self.kv.num_free < n:
            if self._preempt_last(s) is r:
                return False
        return True

    def _alloc(self, r: Req, n_new: int, n_blocks: int) -> None:
        kv = self.kv
        kv.take(n_blocks)
        r.anon += n_blocks
        if kv.caching and r.hashes:
            # cache_blocks(): prompt blocks that are full after this step get their hash.
            full = min((r.computed + n_new) // self.bs, len(r.hashes))
            while len(r.hashed) < full:
                blk = kv.register(r.hashes[len(r.hashed)])
                if blk is None:
                    # An identical block is cached already (computed concurrently by another
                    # request): vLLM keeps the first; ours stays anonymous and, to keep the
                    # hashed blocks a block-table prefix, so do this request's later blocks.
                    r.hashes = r.hashes[: len(r.hashed)]
                    break
                r.anon -= 1
                r.hashed.append(blk)
        self._sched.append((r, n_new))

    # -- one step ------------------------------------------------------------------
    def schedule(self, s: int) -> StepStats:
        """Schedule step ``s`` (a global step counter that increases by one per step)."""
        self._sched = []
        self._preempted_now = False
        bs = self.bs
        if self.exact and self.n_dec:
            for r in self.decode_members():
                self._leave_decode(r, s)
        xs = sorted(self.explicit, key=_seq_key)
        need_x = sum(self._need(r) for r in xs)
        budget = self.mnbt
        crossers = self._phase[s % bs]
        if self.n_dec + need_x <= budget:
            # The budget binds nobody: list order matters only for preemption victims.
            events = sorted([*crossers, *xs], key=_seq_key)
            for r in events:
                if r.status != RUNNING:
                    continue  # preempted earlier in this step
                if r.dec:
                    if self.kv.num_free < 1 and not self._make_room(1, r, s):
                        break
                    self.kv.take(1)
                else:
                    if not self._schedule_explicit(r, budget, s):
                        break
            used = self.n_dec + sum(n for _, n in self._sched)
        else:
            if self.n_dec > budget or (xs and xs[0].seq < self._max_dec_seq()):
                # The budget binds in an order the fast path cannot see: run the plain loop.
                for r in self.decode_members():
                    self._leave_decode(r, s)
                xs = sorted(self.explicit, key=_seq_key)
                crossers = {}
            # Decode requests all precede the explicit ones: they take one token each.
            for r in sorted(crossers, key=_seq_key):
                if r.status != RUNNING:
                    continue
                if self.kv.num_free < 1 and not self._make_room(1, r, s):
                    break
                self.kv.take(1)
            used = self.n_dec
            for r in xs:
                if budget - used <= 0:
                    break
                if r.status != RUNNING:
                    continue
                before = len(self._sched)
                if not self._schedule_explicit(r, budget - used, s):
                    break
                if len(self._sched) > before:
                    used += self._sched[-1][1]
        if not self._preempted_now:
            used = self._admit(s, budget - used)
        return self._stats(s)

    def _schedule_explicit(self, r: Req, budget_left: int, s: int) -> bool:
        n = min(self._need(r), budget_left)
        if n <= 0:
            return True
        nb = -(-(r.computed + n) // self.bs) - self._held(r)
        if nb > self.kv.num_free and not self._make_room(nb, r, s):
            return False
        self._alloc(r, n, nb)
        return True

    def _admit(self, s: int, budget_left: int) -> int:
        kv, bs, waiting, running = self.kv, self.bs, self.waiting, self.running
        used = self.mnbt - budget_left
        while waiting and budget_left > 0 and len(running) < self.mns:
            r = waiting[0]
            hits = kv.lookup(r.hashes, (r.num_tokens - 1) // bs) if kv.caching and r.hashes else []
            computed = len(hits) * bs
            n = r.num_tokens - computed
            if 0 < self.thr < n:
                n = self.thr
            if not self.chunked and n > budget_left:
                break
            n = min(n, budget_left)
            nb = -(-(computed + n) // bs) - len(hits)
            if nb + (kv.evictable(hits) if hits else 0) > kv.num_free:
                break
            waiting.popleft()
            if kv.caching:
                self.prefix_queries += r.num_tokens
                self.prefix_hits += computed
            kv.touch(hits)
            r.hashed = hits
            r.anon = 0
            r.computed = computed
            r.status = RUNNING
            self._seq += 1
            r.seq = self._seq
            running[r] = None
            self.explicit[r] = None
            if r.t_sched < 0:
                r.t_sched = s
                r.cached = computed
            self._alloc(r, n, nb)
            budget_left -= n
            used += n
        return used

    def _stats(self, s: int) -> StepStats:
        st = StepStats()
        n_dec = self.n_dec
        st.decode_tokens = n_dec
        st.sum_decode_ctx = self._ctx_base + n_dec * s
        st.num_sampled = n_dec
        st.num_scheduled = n_dec + len(self._sched)
        for r, n in self._sched:
            if r.computed + n == r.num_tokens:
                st.num_sampled += 1
            if n == 1 and r.computed + 1 == r.num_tokens:
                st.decode_tokens += 1
                st.sum_decode_ctx += r.computed + 1
            else:
                st.prefill_tokens += n
                st.prefill_work += n * (r.computed + n / 2)
        st.num_tokens = st.decode_tokens + st.prefill_tokens
        st.preempted = int(self._preempted_now)
        return st

    def complete(self, s: int) -> None:
        """Apply the outputs of step ``s``: advance explicit requests, sample, finish."""
        self.finished = []
        self.emitted = []
        for r, n in self._sched:
            r.computed += n
            if r.computed == r.num_tokens:
                r.output += 1
                r.emit_range(s, s + 1)
                if r.t_first < 0:
                    r.t_first = s
                self.emitted.append(r)
                if r.output >= r.max_tokens:
                    self._finish(r, s)
                elif not self.exact:
                    self._enter_decode(r, s + 1)
        heap = self._fin_heap
        while heap and heap[0][0] <= s:
            _, _, r = heapq.heappop(heap)
            if r.dec and r.fin_step == s and r.status == RUNNING:
                r.emit_range(r.s0, s + 1)
                r.output = r.max_tokens
                r.computed = r.c0 + (s - r.s0) + 1
                self._finish(r, s)

    def abort(self, r: Req, s: int) -> None:
        """Drop a request between steps (client went away): free its blocks, as vLLM's
        ``finish_requests(..., FINISHED_ABORTED)``. ``s`` is the next step to be scheduled."""
        if r.status == WAITING:
            try:
                self.waiting.remove(r)
            except ValueError:
                return
            r.status = FINISHED
            r.finish_reason = "abort"
            return
        if r.status != RUNNING:
            return
        if r.dec:
            self._leave_decode(r, s)
        self._finish(r, s - 1)
        r.finish_reason = "abort"
        self.finished.remove(r)

    def _finish(self, r: Req, s: int) -> None:
        del self.running[r]
        if r.dec:
            self._drop_decode(r)
        else:
            del self.explicit[r]
        self.kv.free(r.anon, r.hashed)
        r.anon = 0
        r.hashed = []
        r.status = FINISHED
        r.t_finish = s
        r.finish_reason = "length"
        self.finished.append(r)


def _seq_key(r: Req) -> int:
    return r.seq
