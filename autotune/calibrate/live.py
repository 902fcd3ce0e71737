"""Run the probe suite against a live server (the I/O edge of calibration).

Each probe runs alone, one after another, through the load generator the studies use
(:func:`autotune.loadgen.run_load`), with prompts fitted to the server's tokenizer
(docs/loadgen.md#4-exact-prompt-lengths); a short warm-up first keeps the first probe from
paying the server's first-request costs. Times are engine seconds (a simulated server's
virtual clock, a real one's wall clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.calibrate.observe import Observation, observe, timings_of_records
from autotune.calibrate.probes import Probe, probe_workload
from autotune.loadgen import (
    LoadOptions,
    ServerInfo,
    make_session,
    probe_server,
    run_load,
)
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import DEFAULT_VOCAB_SIZE

__all__ = ["ProbeRun", "SuiteRun", "run_suite"]

_WARMUP = 4  # requests before the first probe


@dataclass(frozen=True)
class ProbeRun:
    """One probe as it ran: its figures and how many of its requests succeeded and failed."""

    probe: Probe
    observations: tuple[Observation, ...]
    completed: int
    failed: int


@dataclass(frozen=True)
class SuiteRun:
    """The whole suite on one server, and the wall seconds it took."""

    server: ServerInfo
    runs: tuple[ProbeRun, ...]
    wall_s: float

    @property
    def observations(self) -> list[Observation]:
        return [o for r in self.runs for o in r.observations]


async def run_suite(
    base_url: str,
    probes: Sequence[Probe],
    *,
    model: str | None = None,
    api_key: str | None = None,
    model_dir: str | None = None,
    progress: Callable[[ProbeRun], None] | None = None,
) -> SuiteRun:
    """Send every probe to ``base_url`` in order and reduce each to its figures."""
    t0 = time.monotonic()
    info = await probe_server(base_url, api_key)
    vocab = info.vocab_size or DEFAULT_VOCAB_SIZE
    async with make_session() as session:
        tokens = await server_tokens(
            session, info, model=model, api_key=api_key, model_dir=model_dir
        )
        warm = Workload(
            [WorkloadRequest(16, 8, arrival=None, request_id=f"warm-{i}") for i in range(_WARMUP)],
            "calibration warm-up",
            closed_loop_concurrency=1,
        )
        loads = [warm] + [probe_workload(p, i) for i, p in enumerate(probes)]
        prepared = [
            await prepare_for_server(wl, tokens, endpoint="completions", vocab_size=vocab)
            for wl in loads
        ]
    runs: list[ProbeRun] = []
    for k, wl in enumerate(prepared):
        res = await run_load(
            info.base_url,
            wl.requests,
            LoadOptions(
                model=model or info.model_id,
                api_key=api_key,
                max_concurrency=wl.closed_loop_concurrency,
                time_scale=info.time_scale,
                drain_timeout=120.0,
            ),
        )
        if k == 0:
            continue  # the warm-up
        probe = probes[k - 1]
        ok = [r for r in res.records if r.success]
        run = ProbeRun(
            probe,
            tuple(observe(probe, timings_of_records(ok))),
            completed=len(ok),
            failed=len(res.records) - len(ok),
        )
        runs.append(run)
        if progress is not None:
            progress(run)
    return SuiteRun(info, tuple(runs), time.monotonic() - t0)
