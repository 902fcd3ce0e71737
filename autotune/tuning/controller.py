"""The study controller: ``create`` builds the workload, the search space and the baseline
and stores them; ``run`` asks Optuna for trials stage by stage, runs them and tells the
results back. Optuna's RDB storage and autotune's tables share one database (SQLite by
default, Postgres in production), so many controllers can share a study and a run can be
resumed after Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import StudyConfig, parse_config
from autotune.errors import ConfigError, SimStartupError, StorageError
from autotune.sim.hardware import HardwareProfile, get_hardware
from autotune.sim.models import ModelProfile, get_model, load_model_config
from autotune.store import Store, StudyRecord
from autotune.tuning.plan import baseline_engine_args, build_bounds, estimate_peak_concurrency
from autotune.tuning.runners import VirtualRunner, capacity_search, make_runner
from autotune.tuning.scoring import Slo
from autotune.tuning.space import (
    MNBT_PARAM,
    PARAM_ORDER,
    SpaceBounds,
    mnbt_range,
    suggest,
    unit_from_mnbt,
)
from autotune.tuning.strategy import next_stage, planned_total, sampler_for
from autotune.tuning.trial import Event, TrialSetup, run_trial
from autotune.workload.build import build_workload
from autotune.workload.core import Workload

__all__ = ["RunReport", "config_yaml_of", "create_study", "fail_running", "load_study_config",
           "run_study"]

log = logging.getLogger(__name__)
_BOUNDS_ATTR = "autotune.bounds"


@dataclass
class RunReport:
    trials_run: int
    stopped_by: str  # "plan complete" | "n_trials" | "timeout"


def _model(cfg: StudyConfig) -> ModelProfile:
    if cfg.model.config_json:
        return load_model_config(cfg.model.config_json, name=cfg.model.name)
    return get_model(cfg.model.name)


def _bounds_to_json(b: SpaceBounds) -> str:
    return json.dumps(asdict(b))


def _bounds_from_json(text: str) -> SpaceBounds:
    d = json.loads(text)
    d["max_model_len_candidates"] = tuple(d["max_model_len_candidates"])
    d["extras"] = tuple((n, tuple(c)) for n, c in d["extras"])
    return SpaceBounds(**d)


def _sample_params(b: SpaceBounds, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The sampler's parameters for known engine args (to enqueue the baseline)."""
    mml, mns = int(engine_args["max_model_len"]), int(engine_args["max_num_seqs"])
    chunked = bool(engine_args.get("enable_chunked_prefill", b.enable_chunked_prefill))
    lo, hi = mnbt_range(b, mml, mns, chunked)
    out = {"max_model_len": mml,
           "gpu_memory_utilization": float(engine_args["gpu_memory_utilization"]),
           "max_num_seqs": mns,
           MNBT_PARAM: unit_from_mnbt(int(engine_args["max_num_batched_tokens"]), lo, hi)}
    for name, choices in b.extras:
        out[name] = engine_args.get(name, choices[0])
    return out


def _enqueue(study: optuna.Study, cfg: StudyConfig, b: SpaceBounds,
             baseline: dict[str, Any]) -> None:
    configs = [("baseline", baseline)]
    known = set(PARAM_ORDER) | {n for n, _ in b.extras}
    for i, entry in enumerate(cfg.enqueue):
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ConfigError(f"enqueue[{i}].{unknown[0]}: not a tuned parameter "
                              f"(known: {', '.join(sorted(known))})")
        configs.append((f"enqueue-{i}", {**baseline, **entry}))
    for label, engine_args in configs:
        study.enqueue_trial(_sample_params(b, engine_args),
                            user_attrs={"label": label, "engine_args": engine_args})


def load_study_config(rec: StudyRecord) -> StudyConfig:
    return parse_config(rec.config_yaml, f"<stored config of study {rec.name!r}>")


def create_study(cfg: StudyConfig, config_yaml: str, store: Store) -> StudyRecord:
    """Validate everything that can be checked before a launch, then store the study."""
    model, hw = _model(cfg), get_hardware(cfg.hardware)
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)
    prof = wl.profile()
    cands_probe = build_bounds(cfg, model, prof, 0).max_model_len_candidates
    base_mml = max(cands_probe)
    baseline = baseline_engine_args(model, hw, base_mml)
    scale = 1.0
    if cfg.mode == "slo-capacity" and not cfg.workload.peak_concurrency:
        # Concurrency grows with the offered load: size max_num_seqs for the load the
        # baseline itself sustains within the SLOs (a quick sim-virtual capacity search).
        scale = asyncio.run(_baseline_capacity(cfg, model, hw, wl, baseline))
    peak = cfg.workload.peak_concurrency or estimate_peak_concurrency(model, hw, wl, base_mml,
                                                                      scale)
    bounds = build_bounds(cfg, model, prof, peak)
    if store.get_study(cfg.name) is not None:
        raise StorageError(f"study {cfg.name!r} already exists; use `autotune study run "
                           f"{cfg.name}` to continue it or `autotune study delete {cfg.name}`")
    study = optuna.create_study(study_name=cfg.name, storage=store.url,
                                direction="maximize", load_if_exists=True)
    if study.trials:
        raise StorageError(f"an Optuna study named {cfg.name!r} already has trials in this "
                           "database; pick another study name")
    study.set_user_attr(_BOUNDS_ATTR, _bounds_to_json(bounds))
    study.set_user_attr("autotune.baseline", baseline)
    study.set_user_attr("autotune.workload_fingerprint", prof.fingerprint)
    _enqueue(study, cfg, bounds, baseline)
    profile = prof.to_dict() | {"estimated_peak_concurrency": peak}
    rec = StudyRecord(name=cfg.name, config_yaml=config_yaml, workload_profile=profile,
                      mode=cfg.mode, worker_kind=cfg.worker.kind, optuna_study_name=cfg.name)
    rec.id = store.create_study(rec)
    return rec


async def _baseline_capacity(cfg: StudyConfig, model: ModelProfile, hw: HardwareProfile,
                             wl: Workload, baseline: Mapping[str, Any]) -> float:
    runner = VirtualRunner(model, hw, model_name=cfg.model.name, static_args={}, seed=cfg.seed,
                           jitter_cv=0.0)
    try:
        await runner.start(baseline, "capacity-probe")
    except SimStartupError:
        return 1.0
    st = cfg.strategy
    levels = await capacity_search(runner, wl, Slo.of(cfg.slo), low=st.capacity_low,
                                   high=st.capacity_high, budget=st.capacity_levels)
    ok = [lv.scale for lv in levels if lv.feasible]
    return max(ok) if ok else min(lv.scale for lv in levels)


def fail_running(study: optuna.Study, store: Store, name: str) -> None:
    """Mark every RUNNING trial FAIL. Only for trials a killed controller left behind (Ctrl-C
    already fails its own trial): other controllers sharing the study may be running theirs,
    so this is never done implicitly."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
    for tr in store.trials(name):
        if tr.state == "RUNNING" and tr.id is not None:
            store.update_trial(tr.id, state="FAIL")


async def _run(cfg: StudyConfig, store: Store, study: optuna.Study, bounds: SpaceBounds,
               wl: Workload, model: ModelProfile, hw: HardwareProfile, n_trials: int | None,
               timeout: float | None, on_event: Event | None, workdir: Path) -> RunReport:
    runner = make_runner(cfg, model, hw, workdir)
    setup = TrialSetup(cfg, runner, wl, store, cfg.name, on_event)
    limit = n_trials if n_trials is not None else float("inf")  # this run; the plan caps
    t0 = time.monotonic()
    ran = 0
    first = study.get_trials(deepcopy=False)
    planned = planned_total(cfg.strategy, bounds, 1 + len(cfg.enqueue))
    if on_event is not None:
        on_event("run_start", {"planned": planned,
                               "done": sum(1 for t in first if t.state == TrialState.COMPLETE)})
    while True:
        if ran >= limit:
            return RunReport(ran, "n_trials")
        if timeout is not None and time.monotonic() - t0 >= timeout:
            return RunReport(ran, "timeout")
        trials = study.get_trials(deepcopy=False)
        waiting = sum(1 for t in trials if t.state == TrialState.WAITING)
        stage = next_stage(trials, cfg.strategy, bounds, waiting)
        if stage is None:
            return RunReport(ran, "plan complete")
        with warnings.catch_warnings():
            # the baseline may lie outside the ranges on purpose (vLLM's defaults), and
            # PartialFixedSampler is what the staged method needs, experimental or not
            warnings.filterwarnings("ignore", message=".*out of range.*")
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            study.sampler = sampler_for(stage, trials, bounds, cfg.seed + len(trials))
            trial = study.ask()
            values = suggest(trial, bounds)
        engine_args = dict(trial.user_attrs.get("engine_args") or values.engine_args())
        label = trial.user_attrs.get("label")
        stage_name = "baseline" if label == "baseline" else (label or stage)
        caps = [t.user_attrs.get("capacity_scale") for t in trials
                if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")]
        setup.start_scale = max((c for c in caps if c), default=1.0)
        trial.set_user_attr("stage", stage_name)
        trial.set_user_attr("engine_args", engine_args)
        try:
            out = await run_trial(setup, number=trial.number, stage=stage_name,
                                  params=trial.params, engine_args=engine_args)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        for name, value in out.score.constraints.items():
            trial.set_constraint(name, value)
        trial.set_user_attr("feasible", out.score.feasible)
        trial.set_user_attr("failure_class", out.failure_class)
        trial.set_user_attr("capacity_scale", out.score.capacity_scale)
        trial.set_user_attr("launch_command", out.record.launch_command)
        top = out.record.headline_level()
        if top is not None:
            trial.set_user_attr("p99_ttft_ms", top.p99_ttft_ms)
            trial.set_user_attr("p99_tpot_ms", top.p99_tpot_ms)
        if out.record.diagnosis:
            trial.set_user_attr("diagnosis", out.record.diagnosis.get("kind"))
            trial.set_user_attr("diagnosis_suggestion", out.record.diagnosis.get("suggestion"))
        study.tell(trial, out.score.objective)
        ran += 1


def run_study(name: str, store: Store, *, n_trials: int | None = None,
              timeout: float | None = None, on_event: Event | None = None,
              workdir: Path | None = None, reset_running: bool = False) -> RunReport:
    rec = store.get_study(name)
    if rec is None:
        raise StorageError(f"no study named {name!r} in {store.url.split('@')[-1]}; "
                           "create it with `autotune study create --config FILE`")
    cfg = load_study_config(rec)
    model, hw = _model(cfg), get_hardware(cfg.hardware)
    study = optuna.load_study(study_name=rec.optuna_study_name, storage=store.url)
    bounds = _bounds_from_json(str(study.user_attrs[_BOUNDS_ATTR]))
    wl = build_workload(cfg.workload, vocab_size=model.vocab_size)
    if wl.fingerprint() != study.user_attrs.get("autotune.workload_fingerprint"):
        raise ConfigError(f"study {name!r}: the workload no longer matches the one the study "
                          "was created with (its file changed?); create a new study")
    if reset_running:
        fail_running(study, store, name)
    work = workdir or Path(cfg.worker.workdir) / name
    return asyncio.run(_run(cfg, store, study, bounds, wl, model, hw, n_trials, timeout,
                            on_event, work))


def config_yaml_of(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror or exc})") from exc

