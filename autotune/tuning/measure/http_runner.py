"""The ``sim`` / ``vllm`` runner: a worker process per trial (simulated or real ``vllm
serve``) and the aiohttp load generator (the protocol:
:mod:`autotune.tuning.measure.runner_protocol`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import ServiceError, WorkerStartupError
from autotune.failures import FailureMatch
from autotune.loadgen.bench_stats import RequestRecord, peak_concurrency
from autotune.loadgen.client import make_session
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.probe import probe_server
from autotune.loadgen.runner import LoadResult, run_load
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.store import WorkerUsage
from autotune.telemetry import PrometheusTelemetry, Scraper, publish_sd_target
from autotune.telemetry.summary import LevelTelemetry, from_scrape
from autotune.tuning.measure.outcome import EnginePeaks, LevelDeath, LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo, offered_rate, with_diagnosis
from autotune.tuning.measure.usage import StartupModel, UsageMeter
from autotune.workers.devices import devices_held
from autotune.workers.vllm import VllmWorker
from autotune.workload.build import scale_rate
from autotune.workload.core import Workload

__all__ = ["HttpRunner", "client_peaks"]

_LOG_SETTLE_S = 0.5
# how long a level the early stop ended waits for the death watch (it polls every 20 ms)
_DEATH_GRACE_S = 0.25


class HttpRunner:
    """``sim`` / ``vllm``: a worker process per trial and the aiohttp load generator.

    Prompts go through the server's calibration (:mod:`autotune.loadgen.tokens`): token ids
    for completions, chat text of the requested lengths, given text counted by the server.
    A worker that dies mid-level (:mod:`autotune.workers.watch`) stops the level at once:
    nothing more is sent, what completed is kept, and the outcome is flagged ``partial`` with
    the death's cause, exit code or signal and the log around it.
    """

    def __init__(
        self,
        worker: VllmWorker,
        *,
        kind: str,
        model_name: str,
        endpoint: str,
        vocab_size: int,
        time_scale: float,
        scrape_interval_s: float = 2.0,
        prometheus_url: str | None = None,
        sd_file: Path | None = None,
        model_dir: Path | None = None,
        warmup: int = 0,
        early_stop: StopRule | None = None,
        startup_model: StartupModel | None = None,
        observe: StopRule | None = None,
    ) -> None:
        self.worker, self.kind, self.model_name = worker, kind, model_name
        # what each worker costs (docs/cost.md): a simulated worker is charged this modelled
        # start-up and its load in engine seconds; None (real vLLM): its measured lifetime
        self.startup_model = startup_model
        self.meter = UsageMeter()
        self.early_stop = early_stop  # None: every level replays to its end
        # the rule that watches a level replayed to its end, noting where it would stop
        # (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees")
        self.observe = observe
        self.warmup = warmup  # requests sent before each level's measured replay
        self.endpoint, self.vocab = endpoint, vocab_size
        self.time_scale = time_scale
        self.scrape_interval_s = scrape_interval_s
        self.prom = (
            PrometheusTelemetry(prometheus_url, scrape_interval_s=scrape_interval_s)
            if prometheus_url
            else None
        )
        self.sd_file = sd_file
        # this runner's entry in the targets file, which parallel lanes share
        self._sd_owner = f"runner-{id(self):x}"
        self.model_dir = model_dir
        self.base_url: str | None = None
        self.trial_name = ""
        self.engine_args: dict[str, Any] = {}
        # called with the requested and the prepared workload before a level is sent (the
        # study checks that server-measured text lengths keep its max_model_len candidates)
        self.check_prepared: Callable[[Workload, Workload], None] | None = None

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        self.engine_args = dict(engine_args)
        every = {**self.worker.static_args, **engine_args}
        self.meter.begin(devices_held(every, self.worker.gpus))
        if self.startup_model is not None:  # a simulated worker: its modelled start on the GPU
            self.meter.started(self.startup_model(every, None))
        try:
            info = await self.worker.start(engine_args, trial_name)
        except WorkerStartupError as exc:
            if self.startup_model is not None:  # as far as the failed start got
                self.meter.started(self.startup_model(every, exc.failure_class))
            raise
        if self.startup_model is None:
            self.meter.started(info.startup_s)
        self.base_url, self.trial_name = info.base_url, trial_name
        if self.prom is not None and self.sd_file is not None:
            # Prometheus discovers each trial's fresh port through this file (file_sd).
            hostport = info.base_url.split("://", 1)[1]
            labels = {"trial": trial_name, "job": "autotune"}
            publish_sd_target(self.sd_file, self._sd_owner, hostport, labels)
        return StartInfo(
            info.command,
            list(info.argv),
            info.startup_s,
            info.kv_cache_tokens,
            info.max_concurrency,
        )

    def set_early_stop(self, rule: StopRule | None) -> StopRule | None:
        """Stop the next levels by ``rule`` (:class:`~.runner_protocol.EarlyStopping`)."""
        prev, self.early_stop = self.early_stop, rule
        return prev

    async def prepare(self, workload: Workload) -> Workload:
        """``workload`` with every prompt as this trial's server should get it."""
        assert self.base_url is not None, "start() first"
        async with make_session() as session:
            try:
                info = await probe_server(self.base_url, self.worker.api_key)
            except ServiceError:
                if self.worker.failure() is None:
                    raise
                return workload  # it died: the level stops before sending anything
            tokens = await server_tokens(
                session,
                info,
                model=self.model_name,
                model_dir=self.model_dir,
                api_key=self.worker.api_key,
            )
            wl = await prepare_for_server(
                workload,
                tokens,
                endpoint=self.endpoint,  # type: ignore[arg-type]
                vocab_size=self.vocab,
            )
        if self.check_prepared is not None:
            self.check_prepared(workload, wl)
        return wl

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome:
        assert self.base_url is not None, "start() first"
        wl = await self.prepare(scale_rate(workload, scale))
        mns = int(self.engine_args.get("max_num_seqs", 0)) or None
        mnbt = int(self.engine_args.get("max_num_batched_tokens", 0)) or None
        if self.prom is not None:
            await asyncio.to_thread(self.prom.wait_for_sample, self.trial_name, time.time())
        t_start = time.time()
        done = [0]

        def seen(p: ProgressSnapshot) -> None:
            # a completed request is progress: the death watch never counts a server whose
            # requests complete as hung (docs/vllm.md#10-whose-death-is-it)
            if p.completed > done[0]:
                done[0] = p.completed
                self.worker.note_progress()
            if progress is not None:
                progress(p)

        async with Scraper(
            self.base_url + "/metrics", interval_s=self.scrape_interval_s
        ) as scraper:
            options = LoadOptions(
                model=self.model_name,
                endpoint=self.endpoint,  # type: ignore[arg-type]
                max_concurrency=wl.closed_loop_concurrency,
                time_scale=self.time_scale,
                api_key=self.worker.api_key,
                warmup=self.warmup,
                early_stop=self.early_stop,
                observe=self.observe,
            )
            res = await run_load(
                self.base_url, wl.requests, options, progress=seen, stop=self.worker.death_event
            )
            stop = res.early_stop
            if res.stopped_at is None and stop is not None and stop.reason == "error_rate":
                await self._death_grace()
            if self.worker.death() is not None:
                await scraper.abandon()  # no after snapshot from a dead or frozen server
        out = LevelOutcome(
            scale,
            offered_rate(workload, scale),
            LevelMetrics.from_summary(res.summary, res.early_stop, res.observed),
            replay_s=res.wall_s,  # wall seconds replayed (warm-ups excluded)
            requests=[r for r in res.records if not r.warmup],
        )
        # the GPU's seconds: a time-scaled simulated server's are engine seconds
        self.meter.replayed(res.wall_s * (self.time_scale if self.startup_model else 1.0))
        if res.stopped_at is not None or self.worker.death() is not None:
            await asyncio.sleep(_LOG_SETTLE_S)  # the dying server's last log lines
            self._flag_partial(out, res, len(wl.requests))
        tel: LevelTelemetry | None = None
        if self.prom is not None:
            tel = await asyncio.to_thread(
                self.prom.level,
                self.trial_name,
                t_start,
                time.time(),
                max_num_seqs=mns,
                max_num_batched_tokens=mnbt,
            )
        elif scraper.result is not None and scraper.result.before is not None:
            tel = from_scrape(scraper.result, max_num_seqs=mns, max_num_batched_tokens=mnbt)
        # a stopped level's requests cut in flight are not among its records, so its client
        # count bounds nothing: only a level that ran to its end stands for another trial
        # (docs/tuning.md#14-settling-losing-trials)
        stopped = res.stopped_at is not None or res.early_stop is not None
        out.peaks = None if stopped else client_peaks(res.records, tel)
        return with_diagnosis(out, tel, mns or 0, mnbt or 0)

    async def _death_grace(self) -> None:
        """A worker killed mid-level fails the requests in flight at once, and the early stop
        on the error limit can end the level before the death watch's next poll: after such a
        stop (never after a latency one), wait a moment for the watch, so the death is recorded
        on the level it cut short (docs/vllm.md#9-worker-death), not found only after it."""
        event = self.worker.death_event
        if event is None or event.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), _DEATH_GRACE_S)

    def _flag_partial(self, out: LevelOutcome, res: LoadResult, planned: int) -> None:
        """Mark a level the worker's death cut short, with what is known of the death."""
        sent = [r.sent_at for r in res.records if not r.warmup and r.sent_at is not None]
        report = self.worker.death_report()
        death = LevelDeath(
            report,
            # perf_counter -> the records' engine seconds
            (report.death.detected_at - res.origin) * res.time_scale if report else None,
            res.stopped_at,
            planned,
            len(sent),
            max(sent, default=None),
        )
        out.death = death
        out.metrics = dataclasses.replace(out.metrics, partial=True)

    def failure(self) -> FailureMatch | None:
        return self.worker.failure()

    async def stop(self) -> None:
        await self.worker.stop()
        if self.base_url is not None and self.prom is not None and self.sd_file is not None:
            publish_sd_target(self.sd_file, self._sd_owner, None)  # Prometheus stops scraping
        self.base_url = None
        if self.meter.open:
            modelled = self.startup_model is not None
            self.meter.end(None if modelled else self.worker.lifetime_s() or 0.0)

    def usage(self) -> WorkerUsage | None:
        return self.meter.last

    def reseed(self, seed: int) -> bool:
        """Whether the running worker can serve a run of another seed
        (docs/tuning.md#7-validation): real vLLM brings its own noise, so it can; a ``sim``
        server's noise is its ``--sim-seed``, fixed at launch, so it cannot."""
        del seed
        return self.base_url is not None and self.startup_model is None

    def split_usage(self) -> WorkerUsage | None:
        """What the running worker cost since its launch or the last split (docs/cost.md)."""
        if not self.meter.open:
            return None
        modelled = self.startup_model is not None
        return self.meter.split(None if modelled else self.worker.lifetime_s() or 0.0)


def client_peaks(records: Sequence[RequestRecord], tel: LevelTelemetry | None) -> EnginePeaks:
    """The engine at its busiest as a client can know it for certain: the most requests in
    flight at once (sent, not yet finished or failed; warm-ups included, on the same clock),
    which the engine's running count cannot exceed, over ``records`` that hold every request
    sent (a level that ran to its end: a stopped one's cut requests are not among them); the
    scraped KV usage's highest sample and the preemption counter's delta, when scraped
    (docs/tuning.md#14-settling-losing-trials)."""
    running = peak_concurrency((r.sent_at, r.finished_at) for r in records if r.sent_at is not None)
    kv = tel.gauges.get("kv_usage") if tel is not None else None
    pre = tel.counters.get("preemptions") if tel is not None and tel.has_deltas else None
    return EnginePeaks(
        running, kv.max if kv is not None else None, int(pre) if pre is not None else None
    )
