"""The runner of a study's worker kind (:func:`make_runner`), and the check its HTTP runners
run on each level's prompts (:func:`length_guard`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.config import StudyConfig
from autotune.errors import ConfigError
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.early_stop import rule_of, verdict_rule_of
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.per_device import PerDevice
from autotune.tuning.measure.runner_protocol import Runner
from autotune.tuning.measure.usage import sim_startup_s
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.search.plan import build_bounds
from autotune.workers.guard import GroupRegistry
from autotune.workers.sim_worker import SimWorker
from autotune.workers.vllm import VllmWorker
from autotune.workload.build import (
    measured_lengths_path,
    model_folder,
    save_measured_lengths,
)
from autotune.workload.core import Workload

__all__ = ["length_guard", "make_runner"]


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
    check_lengths: bool = True,
) -> Runner:
    """The runner of ``cfg``'s worker kind; ``registry`` is told about every worker process
    group (docs/faults.md#3-no-orphaned-workers). ``gpus`` (a lane's devices,
    docs/parallel.md#2-lanes) overrides ``worker.gpus``. A study that searches the
    parallelism measures per device (docs/tuning.md#16-the-parallelism-stage).
    ``check_lengths``: an HTTP runner checks each prepared sample's lengths against the
    study's ``max_model_len`` sizing (:func:`length_guard`); validation's fresh samples turn
    it off, their text lengths being the approximate ones the sizing did not see."""
    runner = _worker_runner(cfg, model, hardware, workdir, registry, gpus, check_lengths)
    if cfg.search.parallelism is not None:
        return PerDevice(runner, cfg.worker.static_args)
    return runner


def _worker_runner(
    cfg: StudyConfig,
    model: ModelProfile,
    hardware: HardwareProfile,
    workdir: Path,
    registry: GroupRegistry | None,
    gpus: str | None,
    check_lengths: bool,
) -> Runner:
    w = cfg.worker
    devices = gpus if gpus is not None else w.gpus
    name = cfg.model.served_name or cfg.model.name
    t = cfg.telemetry
    rule, observe = rule_of(cfg), verdict_rule_of(cfg)
    tel: dict[str, Any] = dict(
        scrape_interval_s=t.scrape_interval_s,
        prometheus_url=t.prometheus_url,
        sd_file=Path(t.sd_file) if t.sd_file else workdir / "prometheus-targets.json",
        warmup=cfg.workload.warmup,
        early_stop=rule,
        observe=observe,
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
            observe=observe,
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
            startup_model=functools.partial(sim_startup_s, model),
            **tel,
        )
        runner.check_prepared = length_guard(cfg, model) if check_lengths else None
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
    runner.check_prepared = length_guard(cfg, model) if check_lengths else None
    return runner
