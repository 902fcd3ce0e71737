"""The probe suite: short, shaped loads whose timings pin down one group of constants each.

docs/calibrate.md#2-the-probe-suite says what each probe isolates:

- ``decode``: one request at a time, a long output at a given context: the inter-token gap
  is one decode step of one sequence (weights, step overhead, KV reads at that context);
- ``prefill``: one request at a time with a one-token output: TTFT is the API server's
  intake plus one prefill of that size;
- ``concurrency``: a closed loop of ``n`` requests: the gap is one step of ``n`` sequences
  (the linear layers' FLOPs as the batch grows);
- ``burst``: ``n`` requests sent at once: the API server tokenizes them one after another,
  so the TTFT spread is its per-request cost.

Pure: a probe is a typed record, and the same record becomes the requests sent to a live
server (:func:`probe_workload`) and the requests the simulated twin replays
(:func:`probe_sim_requests`), so the two always see the same load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.sim import SimRequest
from autotune.workload.core import Workload, WorkloadRequest

__all__ = ["Probe", "ProbeKind", "default_suite", "probe_sim_requests", "probe_workload"]

ProbeKind = Literal["decode", "prefill", "concurrency", "burst"]


@dataclass(frozen=True)
class Probe:
    """One probe: ``requests`` requests of ``prompt_len`` tokens asking ``output_len`` each,
    run with ``concurrency`` in flight (closed loop), or all sent at t = 0 (a burst)."""

    kind: ProbeKind
    prompt_len: int
    output_len: int
    requests: int
    concurrency: int = 1

    def __post_init__(self) -> None:
        if min(self.prompt_len, self.output_len, self.requests, self.concurrency) < 1:
            raise ValueError(f"probe {self.name}: lengths and counts must be >= 1")

    @property
    def name(self) -> str:
        """A stable label: kind, prompt and output lengths, and the load."""
        load = f"x{self.requests}" if self.kind == "burst" else f"c{self.concurrency}"
        return f"{self.kind}-p{self.prompt_len}-o{self.output_len}-{load}"

    @property
    def closed_loop(self) -> bool:
        return self.kind != "burst"


def default_suite(
    max_model_len: int, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048
) -> list[Probe]:
    """The probes for a server with these limits: every prompt fits one step and the context,
    every concurrency fits ``max_num_seqs``. About 300 requests; a few minutes on a GPU."""
    room = max_model_len - 64  # the longest prompt that still leaves a 64-token output
    prefill_cap = min(room, max_num_batched_tokens)
    if prefill_cap < 16:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for the probes")
    out: list[Probe] = []
    for p in sorted({16, min(room, max_model_len // 4), min(room, max_model_len // 2)}):
        out.append(Probe("decode", max(p, 1), 64, requests=5))
    for p in sorted({16, 128, 512, 2048} | {prefill_cap}):
        if p <= prefill_cap:
            out.append(Probe("prefill", p, 1, requests=5))
    for n in (4, 16, 64):
        if n <= max_num_seqs:
            out.append(Probe("concurrency", 64, 64, requests=2 * n, concurrency=n))
    # many sequences at a long context: the only probe whose steps read much KV cache
    n = min(16, max_num_seqs)
    out.append(
        Probe("concurrency", min(room, max_model_len // 2), 64, requests=2 * n, concurrency=n)
    )
    n = min(32, max_num_seqs)
    for p in sorted({32, min(512, prefill_cap // n or 1)}):
        out.append(Probe("burst", p, 4, requests=n))
    return out


def probe_workload(probe: Probe, index: int, run: str = "") -> Workload:
    """The requests a live server gets for ``probe`` (the ``index``-th of the suite): ids are
    unique across the suite, and across runs by ``run`` (a tag of its own per run of the
    suite), so that no prompt repeats, not even when the same server is calibrated twice (a
    prefix-cache hit would fake a fast prefill; the prompts derive from the ids)."""
    reqs = [
        WorkloadRequest(
            probe.prompt_len,
            probe.output_len,
            arrival=None if probe.closed_loop else 0.0,
            request_id=f"calibrate-{run}{index}-{i}",
        )
        for i in range(probe.requests)
    ]
    return Workload(
        reqs,
        f"calibration probe {probe.name}",
        closed_loop_concurrency=probe.concurrency if probe.closed_loop else None,
    )


def probe_sim_requests(probe: Probe) -> list[SimRequest]:
    """The same load as the simulator replays it (distinct anonymous prompts: no cache hits)."""
    return [
        SimRequest(probe.prompt_len, probe.output_len, arrival=0.0, request_id=f"p{i}")
        for i in range(probe.requests)
    ]
