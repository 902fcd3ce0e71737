"""Run the probe suite against a live server (the I/O edge of calibration).

Each probe runs alone, one after another, through the load generator the studies use
(:func:`autotune.loadgen.run_load`), with prompts fitted to the server's tokenizer
(docs/loadgen.md#4-exact-prompt-lengths); a short warm-up first keeps the first probe from
paying the server's first-request costs. Times are engine seconds (a simulated server's
virtual clock, a real one's wall clock).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autotune.calibrate.observe import (
    EngineSums,
    Observation,
    flushed,
    observe,
    timings_of_records,
)
from autotune.calibrate.probes import Probe, probe_workload
from autotune.loadgen import (
    LoadOptions,
    RequestRecord,
    ServerInfo,
    make_session,
    probe_server,
    run_load,
)
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.telemetry.scrape import Snapshot, scrape
from autotune.telemetry.stats import HistogramDelta
from autotune.telemetry.summary import HISTOGRAMS
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import DEFAULT_VOCAB_SIZE

__all__ = ["ProbeRun", "SuiteRun", "engine_delta", "run_suite"]

_WARMUP = 4  # requests before the first probe
# Runs more of a probe whose every streamed request was flushed (observe.flushed): the
# starvation comes and goes (docs/calibrate.md#2-the-probe-suite).
_FLUSH_RETRIES = 2
# The engine core's histograms a probe's figures read (observe.EngineSums); vLLM records a
# step's outputs just after the API server has handed them out, so the scrape after a probe
# waits for the counts to reach what the client received (docs/calibrate.md#2-the-probe-suite).
_ITL = HISTOGRAMS["itl"]
_PREFILL = "vllm:request_prefill_time_seconds"
_SCRAPE_TIMEOUT_S = 10.0
_SETTLE_TRIES = 10
_SETTLE_S = 0.05


def engine_delta(before: Snapshot | None, after: Snapshot | None) -> EngineSums | None:
    """The engine core's sums between two ``/metrics`` pages; None without both pages or
    when the server exposes neither histogram (an older or foreign server)."""
    if before is None or after is None:
        return None
    itl, prefill = (
        HistogramDelta.between(before.histograms.get(name), after.histograms[name])
        if name in after.histograms
        else None
        for name in (_ITL, _PREFILL)
    )
    if itl is None and prefill is None:
        return None
    none = HistogramDelta((), 0.0, 0.0)
    itl, prefill = itl or none, prefill or none
    return EngineSums(itl.sum, itl.count, prefill.sum, prefill.count)


@dataclass(frozen=True)
class ProbeRun:
    """One probe as it ran: its figures, how many of its requests succeeded and failed, and
    how many reached their client in a flush (left out of the figures) over ``attempts``
    runs of it."""

    probe: Probe
    observations: tuple[Observation, ...]
    completed: int
    failed: int
    flushed: int = 0
    attempts: int = 1


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
    """Send every probe to ``base_url`` in order and reduce each to its figures. A probe
    whose every request reached its client in a flush runs again, up to
    :data:`_FLUSH_RETRIES` more times, with prompts of its own each time."""
    t0 = time.monotonic()
    info = await probe_server(base_url, api_key)
    vocab = info.vocab_size or DEFAULT_VOCAB_SIZE
    run_tag = secrets.token_hex(4)  # this run's prompts differ from any earlier run's
    options = LoadOptions(
        model=model or info.model_id,
        api_key=api_key,
        time_scale=info.time_scale,
        drain_timeout=120.0,
    )
    async with make_session() as session:
        tokens = await server_tokens(
            session, info, model=model, api_key=api_key, model_dir=model_dir
        )

        async def send(wl: Workload) -> list[RequestRecord]:
            sent = await prepare_for_server(wl, tokens, endpoint="completions", vocab_size=vocab)
            opts = replace(options, max_concurrency=sent.closed_loop_concurrency)
            return list((await run_load(info.base_url, sent.requests, opts)).records)

        metrics_url = info.base_url.rstrip("/") + "/metrics"

        async def timed(wl: Workload) -> tuple[list[RequestRecord], EngineSums | None]:
            """``send``, with the engine core's sums over it from ``/metrics``."""
            before = await scrape(session, metrics_url, _SCRAPE_TIMEOUT_S)
            records = await send(wl)
            want = sum(1 for r in records if r.success)
            delta = None
            for _ in range(_SETTLE_TRIES):
                after = await scrape(session, metrics_url, _SCRAPE_TIMEOUT_S)
                delta = engine_delta(before, after)
                if delta is None or delta.prefill_count >= want:
                    break
                await asyncio.sleep(_SETTLE_S)
            return records, delta

        await send(
            Workload(
                [
                    WorkloadRequest(16, 8, arrival=None, request_id=f"warm-{run_tag}-{i}")
                    for i in range(_WARMUP)
                ],
                "calibration warm-up",
                closed_loop_concurrency=1,
            )
        )
        runs: list[ProbeRun] = []
        for i, probe in enumerate(probes):
            ok: list[RequestRecord] = []
            failed = 0
            engine: EngineSums | None = EngineSums()
            for attempts in range(1, _FLUSH_RETRIES + 2):
                records, delta = await timed(probe_workload(probe, i, f"{run_tag}-{attempts}-"))
                # every attempt's requests count for the engine core: a flush is the API
                # server's, not the engine's
                engine = None if engine is None or delta is None else engine + delta
                ok += [r for r in records if r.success]
                failed += sum(not r.success for r in records)
                timings = timings_of_records(ok)
                if not all(flushed(t) for t in timings) or not timings:
                    break
            run = ProbeRun(
                probe,
                tuple(observe(probe, timings, engine)),
                completed=len(ok),
                failed=failed,
                flushed=sum(flushed(t) for t in timings),
                attempts=attempts,
            )
            runs.append(run)
            if progress is not None:
                progress(run)
    return SuiteRun(info, tuple(runs), time.monotonic() - t0)
