"""Creating a study (``autotune study create``): the workload, the search space and the
baseline are built and checked before anything is stored, then the Optuna study and
autotune's row; and reading a study's config back (the file given, the YAML stored)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.config import StudyConfig, parse_config
from autotune.errors import ConfigError, StorageError
from autotune.sim import VLLM_VERSION, hardware_of, is_twin_name, load_twin, twin_mismatch
from autotune.store import Store, StudyRecord
from autotune.tuning import study_attrs
from autotune.tuning.measure.baseline_probe import baseline_capacity
from autotune.tuning.measure.validation_plan import repeat_seeds
from autotune.tuning.run.gpu_budget import SIMULATED_CAPACITY
from autotune.tuning.search.plan import (
    FreshLengths,
    baseline_engine_args,
    build_bounds,
    cover_baseline,
    estimate_peak_concurrency,
    longest_candidate_warning,
    model_of,
    screen_max_model_len,
)
from autotune.tuning.search.space import PARAM_ORDER, TP_PARAM, SpaceBounds
from autotune.workload.build import study_workload, workload_sample
from autotune.workload.traces import dropped_text

__all__ = [
    "config_yaml_of",
    "create_study",
    "load_study_config",
    "sized_profile",
    "store_study",
    "twin_warnings",
    "validation_lengths",
]


def _enqueued_configs(
    cfg: StudyConfig, b: SpaceBounds, baseline: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """The baseline and the ``enqueue:`` configs, each checked against the search space
    before anything is stored: a tuned name, and for a parameter with choices (the
    ``max_model_len`` candidates, ``search.extra``) one of them; Optuna would refuse any
    other value only when the trial runs (docs/faults.md#7-enqueued-values)."""
    configs = [("baseline", baseline)]
    known = set(PARAM_ORDER) | {n for n, _ in b.extras} | ({TP_PARAM} if b.parallel else set())
    choices: dict[str, tuple[Any, ...]] = {
        "max_model_len": tuple(b.max_model_len_candidates),
        **dict(b.extras),
        **({TP_PARAM: b.parallel} if b.parallel else {}),
    }
    for i, entry in enumerate(cfg.enqueue):
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ConfigError(
                f"enqueue[{i}].{unknown[0]}: not a tuned parameter "
                f"(known: {', '.join(sorted(known))})",
                field=("enqueue", i, unknown[0]),
            )
        for name, value in entry.items():
            allowed = choices.get(name)
            if allowed is not None and value not in allowed:
                raise ConfigError(
                    f"enqueue[{i}].{name}: {value!r} is not in the search space (this "
                    f"study's choices: {', '.join(repr(c) for c in allowed)})",
                    field=("enqueue", i, name),
                )
        configs.append((f"enqueue-{i}", {**baseline, **entry}))
    return configs


def sized_profile(profile: dict[str, Any], peak: int, simulated: float | None) -> dict[str, Any]:
    """The stored workload profile: the workload's own figures, the peak concurrency that
    sized ``max_num_seqs``, and the baseline's capacity as simulated where it was (it prices
    the plan, docs/cost.md#3-the-plan-and-the-budget). ``study create`` and the nightly warm
    start both store it."""
    out = profile | {"estimated_peak_concurrency": peak}
    if simulated is not None:
        out[SIMULATED_CAPACITY] = simulated
    return out


def validation_lengths(cfg: StudyConfig, vocab_size: int) -> FreshLengths | None:
    """The lengths of every sample the validation phase will replay (its seeds are the
    study's, docs/tuning.md#7-validation), pooled; None with validation off."""
    if not cfg.strategy.validate_.enabled:
        return None
    prompt: list[int] = []
    output: list[int] = []
    for r in range(cfg.validation_repeats):
        sample = workload_sample(cfg, repeat_seeds(cfg, r)[0], vocab_size=vocab_size)[0]
        prompt += [q.prompt_len for q in sample.requests]
        output += [q.output_len for q in sample.requests]
    return FreshLengths(tuple(prompt), tuple(output), cfg.validation_repeats)


def load_study_config(rec: StudyRecord) -> StudyConfig:
    return parse_config(rec.config_yaml, f"<stored config of study {rec.name!r}>")


def create_study(cfg: StudyConfig, config_yaml: str, store: Store) -> StudyRecord:
    """Validate everything that can be checked before a launch, then store the study."""
    model, hw = model_of(cfg), hardware_of(cfg.hardware)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    prof = wl.profile()
    cands_probe = build_bounds(cfg, model, prof, 0).max_model_len_candidates
    base_mml = max(cands_probe)
    baseline = baseline_engine_args(model, hw, base_mml)
    scale, simulated = 1.0, None
    if cfg.mode == "slo-capacity" and not cfg.workload.peak_concurrency:
        # Concurrency grows with the offered load: size max_num_seqs for the load the
        # baseline itself sustains within the SLOs (a quick sim-virtual capacity search).
        scale = simulated = asyncio.run(baseline_capacity(cfg, model, hw, wl, baseline))
    peak = cfg.workload.peak_concurrency or estimate_peak_concurrency(
        model, hw, wl, base_mml, scale
    )
    # every default range reaches the baseline's value, or a note says why not
    bounds, range_notes = cover_baseline(build_bounds(cfg, model, prof, peak), baseline, cfg, peak)
    # Before any launch: candidates whose over-length rate on this workload breaks the limit
    # would fail at every load; they are dropped here, and none left is a config error.
    screening = screen_max_model_len(
        bounds.max_model_len_candidates,
        [r.prompt_len for r in wl.requests],
        [r.output_len for r in wl.requests],
        cfg.slo.max_overlength_rate,
        validation_lengths(cfg, model.vocab_size),
    )
    # the baseline's max_model_len is the longest candidate: kept whenever any is
    bounds = replace(bounds, max_model_len_candidates=screening.kept)
    if bounds.parallel:  # vLLM's default, tensor_parallel_size 1, named: it sizes the devices
        baseline = {**baseline, TP_PARAM: bounds.parallel[0]}
    configs = _enqueued_configs(cfg, bounds, baseline)
    if store.get_study(cfg.name) is not None:
        raise StorageError(
            f"study {cfg.name!r} already exists; use `autotune study run "
            f"{cfg.name}` to continue it or `autotune study delete {cfg.name}`"
        )
    profile = sized_profile(prof.to_dict(), peak, simulated)
    # what `study create` states before anything runs: rows of the file left out, and a
    # baseline max_model_len that a handful of requests set
    if wl.dropped:
        profile["dropped_rows"] = dropped_text(wl.dropped, len(wl))
    tail = (
        None
        if cfg.search.max_model_len.candidates  # the user's own candidates: their choice
        else longest_candidate_warning(
            screening.kept, [r.prompt_len for r in wl.requests], [r.output_len for r in wl.requests]
        )
    )
    warnings = [tail] if tail is not None else []
    warnings += twin_warnings(cfg)
    if warnings:
        profile["warnings"] = warnings
    if range_notes:
        profile["notes"] = range_notes
    header = study_attrs.StudyHeader(bounds, baseline, prof.fingerprint, screening.to_dict())
    return store_study(store, cfg, config_yaml, header, configs, profile)


def twin_warnings(cfg: StudyConfig) -> list[str]:
    """A calibrated profile fitted on another model or vLLM than this study's worker
    (docs/calibrate.md#1-the-command): one line naming each difference. A real worker's
    vLLM version is unknown before it starts; a simulated one's is the simulator's."""
    out = []
    for name in {cfg.hardware, cfg.strategy.twin.profile} - {None}:
        if name is None or not is_twin_name(name):
            continue
        measured = load_twin(name).spec.measured
        served = cfg.model.served_name or cfg.model.name
        vllm = VLLM_VERSION if cfg.worker.kind != "vllm" else None
        diff = twin_mismatch(measured, vllm=vllm, model=served, host=None)
        if diff:
            out.append(f"the calibrated profile {name} was fitted elsewhere: {'; '.join(diff)}")
    return out


def store_study(
    store: Store,
    cfg: StudyConfig,
    config_yaml: str,
    header: study_attrs.StudyHeader,
    configs: Sequence[tuple[str, Mapping[str, Any]]],
    workload_profile: dict[str, Any],
) -> StudyRecord:
    """Open the Optuna study (its header, then ``configs`` enqueued, the baseline first) and
    store autotune's row of it: the last step of ``study create`` and of the nightly warm
    start (docs/nightly.md#4-the-warm-start)."""
    study_attrs.open_study(store.optuna_storage(), cfg.name, header, configs)
    rec = StudyRecord(
        name=cfg.name,
        config_yaml=config_yaml,
        workload_profile=workload_profile,
        mode=cfg.mode,
        worker_kind=cfg.worker.kind,
        optuna_study_name=cfg.name,
    )
    rec.id = store.create_study(rec)
    return rec


def config_yaml_of(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
