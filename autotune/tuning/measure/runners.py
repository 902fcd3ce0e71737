"""Trial runners: start a worker with engine args, replay load levels, stop it.

- :class:`VirtualRunner` (``sim-virtual``): the engine in-process on the virtual clock, no
  HTTP. Its per-request timings become the same records the HTTP client produces, so one
  metric implementation scores both.
- :class:`HttpRunner` (``sim`` and ``vllm``): a worker process (simulated or real ``vllm
  serve``) and the aiohttp load generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autotune.config import StudyConfig
from autotune.errors import ConfigError, ServiceError
from autotune.failures import FailureMatch
from autotune.loadgen.client import make_session
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.probe import probe_server
from autotune.loadgen.runner import LoadResult, run_load
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.loadgen.tokens import prepare_for_server, server_tokens
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, jitter_seed, plan_memory, replay_level, sim_engine_args
from autotune.telemetry import PrometheusTelemetry, Scraper, diagnose, publish_sd_target
from autotune.telemetry.summary import LevelTelemetry, from_scrape
from autotune.tuning.measure.capacity import CapacityResult, CapacitySearch, Lattice
from autotune.tuning.measure.early_stop import rule_of
from autotune.tuning.measure.outcome import LevelDeath, LevelOutcome
from autotune.tuning.measure.scoring import LevelScore, Slo, score_level
from autotune.tuning.search.plan import build_bounds
from autotune.workers.guard import GroupRegistry
from autotune.workers.sim import SimWorker
from autotune.workers.vllm import VllmWorker
from autotune.workers.vllm_command import format_command, vllm_argv
from autotune.workload.build import (
    measured_lengths_path,
    model_folder,
    save_measured_lengths,
    scale_rate,
)
from autotune.workload.core import Workload

__all__ = [
    "HttpRunner",
    "LevelOutcome",
    "Runner",
    "StartInfo",
    "VirtualRunner",
    "capacity_search",
    "length_guard",
    "make_runner",
    "only_overlength",
]

_LOG_SETTLE_S = 0.5


@dataclass
class StartInfo:
    command: str
    argv: list[str]
    startup_s: float
    kv_cache_tokens: int | None
    max_concurrency: float | None


class Runner(Protocol):
    kind: str

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo: ...

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome: ...

    def failure(self) -> FailureMatch | None: ...

    async def stop(self) -> None: ...


def _offered(wl: Workload, scale: float) -> float | None:
    t = wl.arrivals()
    if t is None or len(t) < 2 or t[-1] <= 0:
        return None
    return float(len(t) / t[-1] * scale)


def _with_diagnosis(
    out: LevelOutcome, tel: LevelTelemetry | None, mns: int, mnbt: int
) -> LevelOutcome:
    """Attach the level's telemetry and the seed guide's bottleneck diagnosis
    (docs/method.md#3-reading-the-bottleneck)."""
    if tel is not None:
        out.telemetry = tel
        out.diagnosis = diagnose(tel, max_num_seqs=mns, max_num_batched_tokens=mnbt)
        if "preemptions" in tel.counters:  # the server's counter delta over the level
            out.metrics = out.metrics.with_preemptions(tel.counters["preemptions"])
    return out


class VirtualRunner:
    """``sim-virtual``: every level is one in-process simulation of the scaled workload."""

    kind = "sim-virtual"

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        *,
        model_name: str,
        static_args: Mapping[str, Any],
        seed: int,
        jitter_cv: float,
        warmup: int = 0,
        early_stop: StopRule | None = None,
    ) -> None:
        self.model, self.hardware, self.model_name = model, hardware, model_name
        self.static = dict(static_args)
        self.seed, self.jitter_cv = seed, jitter_cv
        self.warmup = warmup
        self.early_stop = early_stop  # None: every level replays to its end
        self.args: EngineArgs | None = None

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        args = sim_engine_args(engine_args, self.static)
        mem = plan_memory(self.model, self.hardware, args.resolve(self.model, self.hardware))
        self.args = args
        argv = vllm_argv(
            ["vllm"],
            self.model_name,
            engine_args,
            static_args=self.static,
            host="127.0.0.1",
            port=8000,
        )
        return StartInfo(format_command(argv), argv, 0.0, mem.kv_tokens, mem.max_concurrency)

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome:
        assert self.args is not None, "start() first"
        # the replay itself is the simulator's (autotune.sim.replay_level); this side turns
        # it into the level outcome tuning scores
        level = replay_level(
            self.model,
            self.hardware,
            self.args,
            scale_rate(workload, scale),
            seed=jitter_seed(self.seed, scale),
            jitter_cv=self.jitter_cv,
            warmup=self.warmup,
            early_stop=self.early_stop,
        )
        metrics = LevelMetrics.from_summary(level.summary, level.stop)
        out = LevelOutcome(scale, _offered(workload, scale), metrics, replay_s=level.replay_s)
        r = level.args
        return _with_diagnosis(out, level.telemetry, r.max_num_seqs, r.max_num_batched_tokens)

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        self.args = None


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
    ) -> None:
        self.worker, self.kind, self.model_name = worker, kind, model_name
        self.early_stop = early_stop  # None: every level replays to its end
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
        info = await self.worker.start(engine_args, trial_name)
        self.base_url, self.trial_name = info.base_url, trial_name
        self.engine_args = dict(engine_args)
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
            )
            res = await run_load(
                self.base_url, wl.requests, options, progress=seen, stop=self.worker.death_event
            )
            if self.worker.death() is not None:
                await scraper.abandon()  # no after snapshot from a dead or frozen server
        out = LevelOutcome(
            scale,
            _offered(workload, scale),
            LevelMetrics.from_summary(res.summary, res.early_stop),
            replay_s=res.wall_s,  # wall seconds replayed (warm-ups excluded)
        )
        if res.stopped_at is not None:
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
        return _with_diagnosis(out, tel, mns or 0, mnbt or 0)

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


async def capacity_search(
    runner: Runner,
    workload: Workload,
    slo: Slo,
    lattice: Lattice,
    *,
    max_levels: int = 24,
    hint: float | None = None,
    preemption_constraint: bool = False,
    on_level: Callable[[LevelOutcome], None] | None = None,
) -> tuple[CapacityResult, list[LevelScore]]:
    """The lattice capacity search (docs/tuning.md#1-the-capacity-lattice) on a started runner,
    without storage or events: the baseline's capacity probe, the validation runs and the
    benchmarks' re-measurements use exactly the protocol the trials use. ``on_level`` sees
    each level's outcome."""
    search = CapacitySearch(lattice, max_levels, hint)
    levels: list[LevelScore] = []
    while (k := search.next_index()) is not None:
        scale = lattice.scale(k)
        out = await runner.run_level(workload, scale)
        if on_level is not None:
            on_level(out)
        ls = score_level(out.metrics, slo, scale, preemption_constraint=preemption_constraint)
        levels.append(ls)
        search.record(k, ls.feasible)
        if only_overlength(ls) or runner.failure() is not None:
            search.stop()  # no load helps: too long for max_model_len, or the worker died
    return search.result(), levels


def only_overlength(ls: LevelScore) -> bool:
    """Requests too long for max_model_len and nothing else wrong: no load level helps."""
    others = [v for k, v in ls.violations.items() if k != "overlength_rate"]
    return ls.violations["overlength_rate"] > 0 and all(v <= 0 for v in others)


def length_guard(cfg: StudyConfig, model: ModelProfile) -> Callable[[Workload, Workload], None]:
    """The check a study runs on each level's prompts: text prompts measured by the server
    must not change the ``max_model_len`` candidates the study was created with (they were
    sized from lengths counted without the server). When they would, the measured lengths
    are saved where ``study create`` finds them, and the study stops with one line asking
    to re-create it (docs/loadgen.md#43-text-datasets)."""

    def check(requested: Workload, sent: Workload) -> None:
        if not any(r.prompt_text is not None for r in requested.requests):
            return
        before = build_bounds(cfg, model, requested.profile(), 0).max_model_len_candidates
        after = build_bounds(cfg, model, sent.profile(), 0).max_model_len_candidates
        if before == after:
            return
        path = measured_lengths_path(cfg, requested)
        save_measured_lengths(
            path, {r.request_id: r.prompt_len for r in sent.requests if r.prompt_text is not None}
        )
        p99 = requested.profile().total_len.p99, sent.profile().total_len.p99
        raise ConfigError(
            f"study {cfg.name!r}: the server counts the dataset's prompts differently than "
            f"`study create` did (p99 prompt+output {p99[0]:.0f} -> {p99[1]:.0f} tokens), "
            f"which changes the max_model_len candidates {list(before)} -> {list(after)}; "
            f"the measured lengths are saved in {path}: re-create the study "
            f"(`autotune study delete {cfg.name}`, then `autotune study create`)"
        )

    return check


def make_runner(
    cfg: StudyConfig,
    model: ModelProfile,
    hardware: HardwareProfile,
    workdir: Path,
    registry: GroupRegistry | None = None,
    gpus: str | None = None,
) -> Runner:
    """The runner of ``cfg``'s worker kind; ``registry`` is told about every worker process
    group (docs/faults.md#3-no-orphaned-workers). ``gpus`` (a lane's devices,
    docs/parallel.md#2-lanes) overrides ``worker.gpus``."""
    w = cfg.worker
    devices = gpus if gpus is not None else w.gpus
    name = cfg.model.served_name or cfg.model.name
    t = cfg.telemetry
    rule = rule_of(cfg)
    tel: dict[str, Any] = dict(
        scrape_interval_s=t.scrape_interval_s,
        prometheus_url=t.prometheus_url,
        sd_file=Path(t.sd_file) if t.sd_file else workdir / "prometheus-targets.json",
        warmup=cfg.workload.warmup,
        early_stop=rule,
    )
    if w.kind == "sim-virtual":
        return VirtualRunner(
            model,
            hardware,
            model_name=cfg.model.name,
            static_args=w.static_args,
            seed=cfg.seed,
            jitter_cv=w.jitter_cv,
            warmup=cfg.workload.warmup,
            early_stop=rule,
        )
    if w.kind == "sim":
        sim = SimWorker(
            model=cfg.model.name,
            hardware=hardware.name,
            workdir=workdir,
            time_scale=w.time_scale,
            sim_seed=cfg.seed,
            sim_startup_delay=w.sim_startup_delay_s,
            served_model_name=name,
            static_args={**w.static_args, "sim_jitter_cv": w.jitter_cv},
            env=w.env,
            env_passthrough=w.env_passthrough,
            host=w.host,
            startup_timeout_s=w.startup_timeout_s,
            registry=registry,
            gpus=devices,
        )
        runner = HttpRunner(
            sim,
            kind="sim",
            model_name=name,
            endpoint=cfg.workload.endpoint,
            vocab_size=model.vocab_size,
            time_scale=w.time_scale,
            **tel,
        )
        runner.check_prepared = length_guard(cfg, model)
        return runner
    worker = VllmWorker(
        executable=w.vllm_executable,
        model=cfg.model.name,
        served_model_name=name,
        static_args=w.static_args,
        env=w.env,
        env_passthrough=w.env_passthrough,
        gpus=devices,
        host=w.host,
        startup_timeout_s=w.startup_timeout_s,
        workdir=workdir,
        registry=registry,
    )
    # Token ids for real vLLM too: the model folder's tokenizer.json (or the server's
    # /tokenize) says which ids are ordinary (docs/loadgen.md#4-exact-prompt-lengths).
    runner = HttpRunner(
        worker,
        kind="vllm",
        model_name=name,
        endpoint=cfg.workload.endpoint,
        vocab_size=model.vocab_size,
        time_scale=1.0,
        model_dir=model_folder(cfg.model),
        **tel,
    )
    runner.check_prepared = length_guard(cfg, model)
    return runner
