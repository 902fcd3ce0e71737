"""Requests as the simulated engine sees them: the input record, the scheduler's mutable
state, and the timing record handed back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from autotune.sim.kvcache import CachedBlock

__all__ = ["Req", "RequestTiming", "SimRequest"]

WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3


@dataclass(frozen=True)
class SimRequest:
    """One request to simulate: lengths (or prompt token ids), output length, arrival offset."""

    prompt_len: int
    output_len: int
    arrival: float = 0.0
    prompt_token_ids: Sequence[int] | None = None
    request_id: str | None = None
    warmup: bool = False  # sent before the measured replay (its timing is not scored)

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError("prompt_len must equal len(prompt_token_ids)")
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError("prompt_len and output_len must be >= 1")


class Req:
    """Scheduler state of one request.

    A request in *decode mode* (``dec``) advances implicitly: at global step ``s`` it has
    ``c0 + (s - s0)`` computed tokens and ``o0 + (s - s0)`` outputs, and holds
    ``cdiv(computed, block_size)`` blocks. Nothing is written per step; state is
    materialized only when the request leaves decode mode.
    """

    __slots__ = (
        "anon",
        "arrival",
        "c0",
        "cached",
        "computed",
        "dec",
        "fin_step",
        "finish_reason",
        "hashed",
        "hashes",
        "idx",
        "max_tokens",
        "o0",
        "output",
        "preemptions",
        "prompt_len",
        "s0",
        "segs",
        "seq",
        "status",
        "t_finish",
        "t_first",
        "t_sched",
        "user",
    )

    def __init__(
        self,
        idx: int,
        prompt_len: int,
        max_tokens: int,
        arrival: float,
        hashes: list[int],
        user: object = None,
    ) -> None:
        self.idx = idx
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.hashes = hashes
        self.user = user  # the frontend's handle (an HTTP stream), opaque here
        self.status = WAITING
        self.computed = 0
        self.output = 0
        self.anon = 0  # anonymous blocks held (explicit mode only)
        self.hashed: list[CachedBlock] = []  # cached prompt blocks held: a block-table prefix
        self.seq = -1  # position key in the running list (admission order)
        self.dec = False
        self.s0 = self.c0 = self.o0 = self.fin_step = 0
        self.preemptions = 0
        self.cached = 0  # prompt tokens served from the prefix cache at first admission
        # step indices (-1 = not yet); the engine maps them to times
        self.t_sched = -1
        self.t_first = -1
        self.t_finish = -1
        self.finish_reason = ""
        self.segs: list[int] = []  # flat [start, end) pairs of global step indices with a token

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.output

    def outputs_at(self, step: int) -> int:
        """Tokens sampled before global step ``step`` (implicit in decode mode): what the
        steps so far delivered to this request."""
        return self.o0 + (step - self.s0) if self.dec else self.output

    def emit_range(self, start: int, end: int) -> None:
        segs = self.segs
        if segs and segs[-1] == start:
            segs[-1] = end
        else:
            segs.append(start)
            segs.append(end)


@dataclass
class RequestTiming:
    """What happened to one request (seconds on the engine clock)."""

    request_id: str
    prompt_len: int
    output_len: int
    arrival: float
    scheduled: float  # first time scheduled (queue time = scheduled - arrival)
    first_token: float
    finish: float
    token_times: npt.NDArray[np.float64] = field(repr=False)
    preemptions: int = 0
    rejected: bool = False
    reject_reason: str = ""
    truncated: bool = False  # max_tokens cut to max_model_len - prompt (vLLM does the same)
    warmup: bool = False  # a warm-up request (SimRequest.warmup)
    # When the engine core ended the steps that made each token, before the API server
    # delivered them (token_times); vLLM's prefill, decode and inter-token histograms time
    # these (docs/simulator.md#5-metrics-and-logs)
    engine_token_times: npt.NDArray[np.float64] = field(
        default_factory=lambda: np.empty(0), repr=False
    )

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tpot(self) -> float:
        """(e2e - ttft) / (n - 1), 0 for a single-token output (the definition in
        docs/loadgen.md#11-per-request-timings)."""
        n = len(self.token_times)
        return (self.finish - self.first_token) / (n - 1) if n > 1 else 0.0
