"""Trial runners: start a worker with engine args, replay load levels, stop it.

- :class:`VirtualRunner` (``sim-virtual``): the engine in-process on the virtual clock, no
  HTTP. Its per-request timings become the same records the HTTP client produces, so one
  metric implementation scores both.
- :class:`HttpRunner` (``sim`` and ``vllm``): a worker process (simulated or real ``vllm
  serve``) and the aiohttp load generator.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autotune.config import StudyConfig
from autotune.failures import FailureMatch
from autotune.loadgen.metrics import RequestRecord, summarize
from autotune.loadgen.runner import ProgressSnapshot, run_load
from autotune.sim.args import EngineArgs
from autotune.sim.engine import SimResult, simulate
from autotune.sim.hardware import HardwareProfile
from autotune.sim.memory import plan_memory
from autotune.sim.models import ModelProfile
from autotune.telemetry import PrometheusTelemetry, Scraper, diagnose, write_sd_targets
from autotune.telemetry.summary import LevelTelemetry, from_scrape, from_sim_timeline
from autotune.tuning.scoring import LevelScore, Slo, next_scale, score_level
from autotune.workers.sim import SimWorker
from autotune.workers.vllm import VllmWorker, format_command, vllm_argv
from autotune.workload.build import prepare_prompts, scale_rate
from autotune.workload.core import Workload

__all__ = ["HttpRunner", "LevelOutcome", "Runner", "StartInfo", "VirtualRunner", "capacity_search",
           "make_runner", "records_from_sim", "sim_engine_args"]

_SIM_ARG_FIELDS = {"max_model_len", "gpu_memory_utilization", "max_num_seqs",
                   "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
                   "tensor_parallel_size", "block_size", "kv_cache_memory_bytes",
                   "long_prefill_token_threshold", "enforce_eager"}


@dataclass
class StartInfo:
    command: str
    argv: list[str]
    startup_s: float
    kv_cache_tokens: int | None
    max_concurrency: float | None


@dataclass
class LevelOutcome:
    scale: float
    offered_rate: float | None
    metrics: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)  # telemetry and diagnosis


class Runner(Protocol):
    kind: str

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo: ...

    async def run_level(self, workload: Workload, scale: float,
                        progress: Callable[[ProgressSnapshot], None] | None = None
                        ) -> LevelOutcome: ...

    def failure(self) -> FailureMatch | None: ...

    async def stop(self) -> None: ...


def _offered(wl: Workload, scale: float) -> float | None:
    t = wl.arrivals()
    if t is None or len(t) < 2 or t[-1] <= 0:
        return None
    return float(len(t) / t[-1] * scale)


def sim_engine_args(engine_args: Mapping[str, Any], static: Mapping[str, Any]) -> EngineArgs:
    """The simulator's EngineArgs from vLLM-named engine and static args (others ignored,
    as ``autotune sim serve`` ignores flags that do not change the simulation)."""
    merged = {**static, **engine_args}
    return EngineArgs(**{k: v for k, v in merged.items() if k in _SIM_ARG_FIELDS})


def _with_diagnosis(out: LevelOutcome, tel: LevelTelemetry | None, mns: int,
                    mnbt: int) -> LevelOutcome:
    """Attach the level's telemetry and the seed guide's bottleneck diagnosis."""
    if tel is not None:
        d = diagnose(tel, max_num_seqs=mns, max_num_batched_tokens=mnbt)
        out.extra["telemetry"] = tel.to_dict()
        out.extra["diagnosis"] = d.to_dict()
        if "preemptions" in tel.counters:  # the server's counter delta over the level
            out.metrics["num_preemptions"] = tel.counters["preemptions"]
    return out


def records_from_sim(res: SimResult) -> tuple[list[RequestRecord], float]:
    recs: list[RequestRecord] = []
    end = 0.0
    for r in res.requests:
        if r.rejected:
            recs.append(RequestRecord(
                request_id=r.request_id, success=False, error=f"over_length: {r.reject_reason}",
                http_status=400, prompt_len=r.prompt_len, scheduled_at=r.arrival,
                sent_at=r.arrival, finished_at=r.arrival, over_length=True))
            continue
        tt = r.token_times
        end = max(end, r.finish)
        recs.append(RequestRecord(
            request_id=r.request_id, success=True, prompt_len=r.prompt_len,
            prompt_tokens=r.prompt_len, output_tokens=len(tt), scheduled_at=r.arrival,
            sent_at=r.arrival, first_token_at=r.first_token, last_token_at=r.finish,
            finished_at=r.finish, itl=np.diff(tt).tolist(), ttft=r.ttft, e2el=r.e2e,
            truncated=r.truncated))
    return recs, end


class VirtualRunner:
    """``sim-virtual``: every level is one in-process simulation of the scaled workload."""

    kind = "sim-virtual"

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, *, model_name: str,
                 static_args: Mapping[str, Any], seed: int, jitter_cv: float) -> None:
        self.model, self.hardware, self.model_name = model, hardware, model_name
        self.static = dict(static_args)
        self.seed, self.jitter_cv = seed, jitter_cv
        self.args: EngineArgs | None = None
        self._levels = 0

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        args = sim_engine_args(engine_args, self.static)
        mem = plan_memory(self.model, self.hardware, args.resolve(self.model, self.hardware))
        self.args, self._levels = args, 0
        argv = vllm_argv(["vllm"], self.model_name, engine_args, static_args=self.static,
                         host="127.0.0.1", port=8000)
        return StartInfo(format_command(argv), argv, 0.0, mem.kv_tokens, mem.max_concurrency)

    async def run_level(self, workload: Workload, scale: float,
                        progress: Callable[[ProgressSnapshot], None] | None = None
                        ) -> LevelOutcome:
        assert self.args is not None, "start() first"
        wl = scale_rate(workload, scale)
        self._levels += 1
        res = simulate(self.model, self.hardware, self.args, wl.to_sim_requests(),
                       seed=self.seed * 1000 + self._levels, jitter_cv=self.jitter_cv,
                       concurrency=wl.closed_loop_concurrency)
        recs, end = records_from_sim(res)
        start = min((r.scheduled_at for r in recs), default=0.0)
        metrics = summarize(recs, max(end - start, 1e-9))
        out = LevelOutcome(scale, _offered(workload, scale), metrics)
        r = res.args
        tel = from_sim_timeline(res, -1.0, float("inf"), r.max_num_batched_tokens,
                                r.max_num_seqs)
        return _with_diagnosis(out, tel, r.max_num_seqs, r.max_num_batched_tokens)

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        self.args = None


class HttpRunner:
    """``sim`` / ``vllm``: a worker process per trial and the aiohttp load generator."""

    def __init__(self, worker: VllmWorker, *, kind: str, model_name: str,
                 endpoint: str, token_ids: bool, vocab_size: int, time_scale: float,
                 scrape_interval_s: float = 2.0, prometheus_url: str | None = None,
                 sd_file: Path | None = None) -> None:
        self.worker, self.kind, self.model_name = worker, kind, model_name
        self.endpoint, self.token_ids, self.vocab = endpoint, token_ids, vocab_size
        self.time_scale = time_scale
        self.scrape_interval_s = scrape_interval_s
        self.prom = (PrometheusTelemetry(prometheus_url, scrape_interval_s=scrape_interval_s)
                     if prometheus_url else None)
        self.sd_file = sd_file
        self.base_url: str | None = None
        self.trial_name = ""
        self.engine_args: dict[str, Any] = {}

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        info = await self.worker.start(engine_args, trial_name)
        self.base_url, self.trial_name = info.base_url, trial_name
        self.engine_args = dict(engine_args)
        if self.prom is not None and self.sd_file is not None:
            # Prometheus discovers each trial's fresh port through this file (file_sd).
            hostport = info.base_url.split("://", 1)[1]
            write_sd_targets(self.sd_file, [(hostport, {"trial": trial_name,
                                                        "job": "autotune"})])
        return StartInfo(info.command, list(info.argv), info.startup_s, info.kv_cache_tokens,
                         info.max_concurrency)

    async def run_level(self, workload: Workload, scale: float,
                        progress: Callable[[ProgressSnapshot], None] | None = None
                        ) -> LevelOutcome:
        assert self.base_url is not None, "start() first"
        wl = prepare_prompts(scale_rate(workload, scale), token_ids=self.token_ids,
                             vocab_size=self.vocab)
        mns = int(self.engine_args.get("max_num_seqs", 0)) or None
        mnbt = int(self.engine_args.get("max_num_batched_tokens", 0)) or None
        if self.prom is not None:
            await asyncio.to_thread(self.prom.wait_for_sample, self.trial_name, time.time())
        t_start = time.time()
        async with Scraper(self.base_url + "/metrics",
                           interval_s=self.scrape_interval_s) as scraper:
            res = await run_load(self.base_url, wl.requests, model=self.model_name,
                                 endpoint=self.endpoint,  # type: ignore[arg-type]
                                 max_concurrency=wl.closed_loop_concurrency,
                                 time_scale=self.time_scale, progress=progress)
        out = LevelOutcome(scale, _offered(workload, scale), dict(res.summary))
        tel: LevelTelemetry | None = None
        if self.prom is not None:
            tel = await asyncio.to_thread(self.prom.level, self.trial_name, t_start,
                                          time.time(), max_num_seqs=mns,
                                          max_num_batched_tokens=mnbt)
        elif scraper.result is not None and scraper.result.before is not None:
            tel = from_scrape(scraper.result, max_num_seqs=mns, max_num_batched_tokens=mnbt)
        return _with_diagnosis(out, tel, mns or 0, mnbt or 0)

    def failure(self) -> FailureMatch | None:
        return self.worker.failure()

    async def stop(self) -> None:
        await self.worker.stop()
        self.base_url = None


async def capacity_search(runner: Runner, workload: Workload, slo: Slo, *, low: float,
                          high: float, budget: int, start: float = 1.0) -> list[LevelScore]:
    """The bracketed search for the highest load meeting ``slo`` on a started runner (no
    storage, no events): the baseline's capacity probe and the benchmarks' re-measurements."""
    levels: list[LevelScore] = []
    while (scale := next_scale([(lv.scale, lv.feasible) for lv in levels], low=low, high=high,
                               budget=budget, start=start)) is not None:
        out = await runner.run_level(workload, scale)
        levels.append(score_level(out.metrics, slo, scale))
    return levels


def make_runner(cfg: StudyConfig, model: ModelProfile, hardware: HardwareProfile,
                workdir: Path) -> Runner:
    w = cfg.worker
    name = cfg.model.served_name or cfg.model.name
    t = cfg.telemetry
    tel: dict[str, Any] = {
        "scrape_interval_s": t.scrape_interval_s, "prometheus_url": t.prometheus_url,
        "sd_file": Path(t.sd_file) if t.sd_file else workdir / "prometheus-targets.json"}
    if w.kind == "sim-virtual":
        return VirtualRunner(model, hardware, model_name=cfg.model.name,
                             static_args=w.static_args, seed=cfg.seed, jitter_cv=w.jitter_cv)
    if w.kind == "sim":
        sim = SimWorker(model=cfg.model.name, hardware=hardware.name, workdir=workdir,
                        time_scale=w.time_scale, sim_seed=cfg.seed,
                        sim_startup_delay=w.sim_startup_delay_s, served_model_name=name,
                        static_args={**w.static_args, "sim_jitter_cv": w.jitter_cv},
                        env=w.env, host=w.host, startup_timeout_s=w.startup_timeout_s)
        return HttpRunner(sim, kind="sim", model_name=name, endpoint=cfg.workload.endpoint,
                          token_ids=cfg.workload.endpoint == "completions",
                          vocab_size=model.vocab_size, time_scale=w.time_scale, **tel)
    worker = VllmWorker(executable=w.vllm_executable, model=cfg.model.name,
                        served_model_name=name, static_args=w.static_args, env=w.env,
                        gpus=w.gpus, host=w.host, startup_timeout_s=w.startup_timeout_s,
                        workdir=workdir)
    # Real vLLM gets text prompts: token ids need the model's exact vocabulary.
    return HttpRunner(worker, kind="vllm", model_name=name, endpoint=cfg.workload.endpoint,
                      token_ids=False, vocab_size=model.vocab_size, time_scale=1.0, **tel)

