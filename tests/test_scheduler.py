"""V1 scheduler: invariants (hypothesis), fast path == plain V1 loop, hand-traced cases."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.hardware import get_hardware
from autotune.sim.kvcache import block_hashes
from autotune.sim.models import get_model
from autotune.sim.request import FINISHED, Req
from autotune.sim.scheduler import Scheduler

MODEL = get_model("meta-llama/Llama-3.1-8B-Instruct")
HW = get_hardware("H100-80GB")


def resolved(**kw: object) -> ResolvedArgs:
    return EngineArgs(**kw).resolve(MODEL, HW)  # type: ignore[arg-type]


@dataclass
class Trace:
    reqs: list[Req]
    steps: list[tuple[int, ...]]


def run(args: ResolvedArgs, specs: list[tuple[int, int, int, int]], num_blocks: int,
        exact: bool, check: bool = True) -> Trace:
    """Drive the scheduler with arrivals in step units; spec = (prompt, output, arrival, prefix
    group or -1). Checks the invariants after every step."""
    sch = Scheduler(args, num_blocks, exact=exact)
    reqs = []
    for i, (p, o, a, g) in enumerate(specs):
        ids = [g] * min(p, 48) + [1000 + i] * max(0, p - 48) if g >= 0 else None
        hashes = block_hashes(ids, args.block_size) if ids and args.enable_prefix_caching else []
        reqs.append(Req(i, p, o, float(a), hashes))
    pending = sorted(reqs, key=lambda r: r.arrival)
    steps: list[tuple[int, ...]] = []
    s = k = 0
    while k < len(pending) or sch.has_work:
        while k < len(pending) and pending[k].arrival <= s:
            sch.add(pending[k])
            k += 1
        if sch.has_work:
            stt = sch.schedule(s)
            if check:
                assert 0 < stt.num_tokens <= args.max_num_batched_tokens
                assert len(sch.running) <= args.max_num_seqs
                assert 0 <= sch.kv.num_free <= num_blocks
                # Block conservation: distinct blocks held + free blocks == all blocks.
                anon = 0
                shared: set[int] = set()
                for r in sch.running:
                    if r.dec:
                        c = r.c0 + s - r.s0
                        held = -(-c // args.block_size) + (c % args.block_size == 0)
                        anon += held - len(r.hashed)
                    else:
                        anon += r.anon
                    shared.update(id(b) for b in r.hashed)
                assert anon + len(shared) + sch.kv.num_free == num_blocks
            sch.complete(s)
            steps.append((stt.num_tokens, stt.num_sampled, stt.sum_decode_ctx,
                           round(stt.prefill_work, 6), stt.num_scheduled, stt.preempted))
        s += 1
    return Trace(reqs, steps)


def outcome(t: Trace) -> list[tuple[object, ...]]:
    return [(r.segs, r.t_sched, r.t_first, r.t_finish, r.preemptions, r.output) for r in t.reqs]


specs_st = st.lists(
    st.tuples(st.integers(1, 200), st.integers(1, 100), st.integers(0, 30),
              st.sampled_from([-1, -1, 0, 1])),
    min_size=1, max_size=30,
)


@st.composite
def configs(draw: st.DrawFn) -> tuple[ResolvedArgs, int]:
    mml = 320
    bs = draw(st.sampled_from([4, 16]))
    mns = draw(st.sampled_from([1, 2, 4, 8, 64]))
    mnbt = draw(st.sampled_from([64, 128, 512, 2048]).filter(lambda x: x >= mns))
    chunked = draw(st.booleans()) or mnbt >= mml
    if not chunked and mnbt < mml:
        mnbt = 512
    args = resolved(max_model_len=mml, max_num_seqs=mns, max_num_batched_tokens=mnbt,
                    block_size=bs, enable_chunked_prefill=chunked,
                    long_prefill_token_threshold=draw(st.sampled_from([0, 0, 32])),
                    enable_prefix_caching=draw(st.booleans()))
    min_blocks = -(-mml // bs)
    blocks = max(min_blocks, draw(st.sampled_from([0, 30, 100, 1000])))
    return args, blocks


@settings(max_examples=150)
@given(configs(), specs_st)
def test_fast_path_equals_plain_v1_loop(cfg: tuple[ResolvedArgs, int],
                                        specs: list[tuple[int, int, int, int]]) -> None:
    args, blocks = cfg
    specs = [(p, o, a, g) for p, o, a, g in specs if p + o <= args.max_model_len]
    if not specs:
        return
    exact = run(args, specs, blocks, exact=True)
    fast = run(args, specs, blocks, exact=False)
    event(f"preemptions: {min(sum(r.preemptions for r in exact.reqs), 3)}")
    event(f"prefix hits: {bool(any(r.hashes for r in exact.reqs))}")
    assert outcome(fast) == outcome(exact)
    assert fast.steps == exact.steps


@settings(max_examples=100)
@given(configs(), specs_st)
def test_every_request_finishes_with_its_output_length(
        cfg: tuple[ResolvedArgs, int], specs: list[tuple[int, int, int, int]]) -> None:
    args, blocks = cfg
    specs = [(p, o, a, g) for p, o, a, g in specs if p + o <= args.max_model_len]
    t = run(args, specs, blocks, exact=False)
    for r, (_, o, a, _) in zip(t.reqs, specs, strict=True):
        assert r.status == FINISHED and r.output == o
        emitted = sum(r.segs[i + 1] - r.segs[i] for i in range(0, len(r.segs), 2))
        assert emitted == o  # exactly one token per sampling step, no more, no less
        assert a <= r.t_sched <= r.t_first <= r.t_finish
    total_sampled = sum(x[1] for x in t.steps)
    assert total_sampled == sum(o for _, o, _, _ in specs)


# -- hand-traced cases ----------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_and_samples_only_at_the_end() -> None:
    args = resolved(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8, block_size=4)
    t = run(args, [(20, 3, 0, -1)], num_blocks=32, exact=False)
    (r,) = t.reqs
    # 8 + 8 + 4 prompt tokens, the first token when the prompt completes (step 2), then decodes
    assert [s[0] for s in t.steps] == [8, 8, 4, 1, 1]
    assert [s[1] for s in t.steps] == [0, 0, 1, 1, 1]
    # prefill attention work t*(p + t/2) per chunk
    assert [s[3] for s in t.steps[:3]] == [8 * 4, 8 * (8 + 4), 4 * (16 + 2)]
    assert (r.t_first, r.t_finish, r.segs) == (2, 4, [2, 5])


def test_chunked_prefill_off_admits_only_whole_prompts() -> None:
    args = resolved(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=4,
                    enable_chunked_prefill=False)
    t = run(args, [(40, 2, 0, -1), (30, 2, 0, -1)], num_blocks=64, exact=False)
    a, b = t.reqs
    # 40 + 30 > 64: the second prompt does not fit the rest of the budget and waits a step
    assert t.steps[0][0] == 40 and a.t_first == 0
    assert b.t_sched == 1 and b.t_first == 1


def test_preemption_takes_the_last_running_request_and_recomputes_it() -> None:
    # 4 blocks of 4 tokens; two requests of 4 + 8 tokens each need 3 blocks at the end.
    args = resolved(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=64, block_size=4)
    t = run(args, [(4, 8, 0, -1), (4, 8, 0, -1)], num_blocks=4, exact=False)
    a, b = t.reqs
    # A block is needed when a request's computed tokens sit on a block boundary: steps 1
    # (4 computed) and 5 (8 computed). At step 5 no block is free: A (first in the list)
    # preempts B (the last), and nothing is admitted in a preempting step.
    assert [s[5] for s in t.steps] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert (a.preemptions, a.segs, a.t_finish) == (0, [0, 8], 7)
    # B had 5 tokens out; it waits until A frees its blocks, then recomputes prompt + outputs
    # (9 tokens, 3 blocks) in one chunk and samples its 6th token
    assert b.preemptions == 1 and b.t_sched == 0
    assert t.steps[6][:2] == (1, 1) and t.steps[8][:2] == (9, 1)
    assert b.segs == [0, 5, 8, 11] and b.output == 8


def test_prefix_hit_skips_cached_blocks() -> None:
    args = resolved(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=4)
    sch_trace = run(args, [(12, 2, 0, 0), (12, 2, 5, 0)], num_blocks=16, exact=False)
    b = sch_trace.reqs[1]
    assert sch_trace.steps[0][0] == 12  # A computes its whole prompt
    # B has the same 12-token prompt: at most (12 - 1) // 4 = 2 blocks may hit (vLLM always
    # recomputes the last token), so it computes only 4 tokens on a prefix of 8
    assert sch_trace.steps[2][0] == 4
    assert sch_trace.steps[2][3] == 4 * (8 + 4 / 2)
    assert b.t_first == 5


def test_prefix_hits_are_counted_in_tokens() -> None:
    args = resolved(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=4)
    sch = Scheduler(args, 16)
    ids = list(range(12))
    a = Req(0, 12, 2, 0.0, block_hashes(ids, 4))
    sch.add(a)
    for s in range(2):
        sch.schedule(s)
        sch.complete(s)
    b = Req(1, 12, 2, 0.0, block_hashes(ids, 4))
    sch.add(b)
    sch.schedule(2)
    assert (sch.prefix_queries, sch.prefix_hits) == (24, 8)
    # without prefix caching nothing is looked up
    off = Scheduler(resolved(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64,
                             block_size=4, enable_prefix_caching=False), 16)
    off.add(Req(0, 12, 2, 0.0, block_hashes(ids, 4)))
    off.schedule(0)
    assert (off.prefix_queries, off.prefix_hits) == (0, 0)


def test_max_num_seqs_caps_running_and_the_rest_wait() -> None:
    args = resolved(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=64, block_size=4)
    sch = Scheduler(args, 64)
    for i in range(5):
        sch.add(Req(i, 4, 10, 0.0, []))
    sch.schedule(0)
    assert len(sch.running) == 2 and len(sch.waiting) == 3


def test_long_prefill_token_threshold_clamps_chunks() -> None:
    args = resolved(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, block_size=4,
                    long_prefill_token_threshold=16)
    t = run(args, [(40, 1, 0, -1), (8, 1, 0, -1)], num_blocks=64, exact=False)
    # both prompts are chunked at 16 tokens per step; the short one fits in one chunk
    assert t.steps[0][0] == 16 + 8
    assert [s[0] for s in t.steps] == [24, 16, 8]
