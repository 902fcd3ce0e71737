"""The warm start (docs/nightly.md#4-the-warm-start): a dated study whose baseline is the
incumbent as-is (the reference every gain is measured against) and whose first trials are
the previous study's top configs projected into today's search space.

The dated study is an ordinary study (``autotune study show`` reads it); only its creation
differs from ``study create``: the baseline is the incumbent instead of vLLM's defaults, and
today's space is widened just enough to hold the incumbent's own values, so that it runs
unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from autotune.config import StudyConfig
from autotune.errors import StorageError
from autotune.sim import hardware_of
from autotune.store import Store, StudyRecord
from autotune.tuning.measure.baseline_probe import baseline_capacity
from autotune.tuning.run.create import sized_profile, store_study
from autotune.tuning.search.plan import (
    baseline_engine_args,
    build_bounds,
    estimate_peak_concurrency,
    model_of,
)
from autotune.tuning.search.space import SpaceBounds, mnbt_engine_value, mnbt_range
from autotune.tuning.study_attrs import StudyHeader
from autotune.workload.build import study_workload

__all__ = ["Projection", "create_warm_study", "project", "study_yaml", "today_bounds", "widen_for"]


@dataclasses.dataclass(frozen=True)
class Projection:
    label: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]

    @property
    def changed(self) -> list[str]:
        return [k for k in self.after if self.before.get(k) != self.after[k]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "before": dict(self.before),
            "after": dict(self.after),
            "changed": self.changed,
        }


def project(
    engine_args: Mapping[str, Any], b: SpaceBounds, label: str = "", fits: int = 0
) -> Projection:
    """``engine_args`` moved into ``b``: ``max_model_len`` to the smallest candidate that
    holds both it and ``fits`` (the smallest length today's traffic fits in; else the
    largest candidate), the others clamped to their ranges (``max_num_batched_tokens`` to
    the range valid for the projected values)."""
    cands = sorted(b.max_model_len_candidates)
    mml = max(int(engine_args["max_model_len"]), fits)
    new_mml = next((c for c in cands if c >= mml), cands[-1])
    util = round(min(max(float(engine_args["gpu_memory_utilization"]), b.util_low), b.util_high), 2)
    mns = min(max(int(engine_args["max_num_seqs"]), b.mns_low), b.mns_high)
    lo, hi = mnbt_range(b, new_mml, mns, b.enable_chunked_prefill)
    mnbt = mnbt_engine_value(int(engine_args["max_num_batched_tokens"]), lo, hi)
    after = {
        "max_model_len": new_mml,
        "gpu_memory_utilization": util,
        "max_num_seqs": mns,
        "max_num_batched_tokens": mnbt,
    }
    for name, choices in b.extras:
        after[name] = engine_args.get(name, choices[0])
        if after[name] not in choices:
            after[name] = choices[0]
    return Projection(label, dict(engine_args), after)


def widen_for(b: SpaceBounds, engine_args: Mapping[str, Any]) -> SpaceBounds:
    """``b`` grown just enough to hold ``engine_args`` unchanged (the incumbent)."""
    mml = int(engine_args["max_model_len"])
    util = float(engine_args["gpu_memory_utilization"])
    mns = int(engine_args["max_num_seqs"])
    mnbt = int(engine_args["max_num_batched_tokens"])
    return dataclasses.replace(
        b,
        max_model_len_candidates=tuple(sorted({*b.max_model_len_candidates, mml})),
        util_low=min(b.util_low, util),
        util_high=max(b.util_high, util),
        mns_low=min(b.mns_low, mns),
        mns_high=max(b.mns_high, mns),
        mnbt_low=min(b.mnbt_low, mnbt),
        mnbt_high=max(b.mnbt_high, mnbt),
    )


def today_bounds(cfg: StudyConfig) -> tuple[SpaceBounds, dict[str, Any]]:
    """Today's space before any peak-concurrency sizing (its ``max_model_len`` candidates),
    and vLLM's defaults at the largest candidate."""
    model, hw = model_of(cfg), hardware_of(cfg.hardware)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    b = build_bounds(cfg, model, wl.profile(), 0)
    return b, baseline_engine_args(model, hw, max(b.max_model_len_candidates))


def study_yaml(cfg: StudyConfig) -> str:
    """The YAML a dated study is stored with (``study show`` and resumes re-read it)."""
    data = cfg.model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=False)


def create_warm_study(
    cfg: StudyConfig,
    store: Store,
    incumbent: Mapping[str, Any],
    warm: Sequence[tuple[str, Mapping[str, Any]]],
    fits: int = 0,
) -> tuple[StudyRecord, list[Projection]]:
    """Store the dated study: the incumbent as its baseline, then ``warm`` (label, engine
    args) projected into today's space (``max_model_len`` at least ``fits``, the smallest
    candidate today's traffic fits in); returns the record and the projections."""
    model, hw = model_of(cfg), hardware_of(cfg.hardware)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    prof = wl.profile()
    scale = asyncio.run(baseline_capacity(cfg, model, hw, wl, incumbent))
    probe = build_bounds(cfg, model, prof, 0)
    peak = cfg.workload.peak_concurrency or estimate_peak_concurrency(
        model, hw, wl, max(probe.max_model_len_candidates), scale
    )
    today = build_bounds(cfg, model, prof, peak)
    projections = [project(args, today, label, fits) for label, args in warm]
    seen = [dict(incumbent)]
    configs: list[tuple[str, dict[str, Any]]] = [("baseline", dict(incumbent))]
    for p in projections:
        if dict(p.after) not in seen:
            seen.append(dict(p.after))
            configs.append((p.label, dict(p.after)))
    bounds = widen_for(today, incumbent)
    cfg = cfg.model_copy(update={"enqueue": [dict(a) for _, a in configs[1:]]})
    if store.get_study(cfg.name) is not None:
        raise StorageError(f"study {cfg.name!r} already exists")
    header = StudyHeader(
        bounds,
        dict(incumbent),
        prof.fingerprint,
        nightly_projection=[p.to_dict() for p in projections],
    )
    profile = sized_profile(prof.to_dict(), peak, scale)
    rec = store_study(store, cfg, study_yaml(cfg), header, configs, profile)
    return rec, projections
