"""From a study config and its workload to the search space and the baseline (pure logic,
plus one quick in-process simulation to estimate peak concurrency when it is not given)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from autotune.config import ModelConfig, RangeSpec, StudyConfig
from autotune.errors import ConfigError, SimStartupError
from autotune.profiles.flags import flag_key
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile, get_model, load_model_config
from autotune.sim import EngineArgs, sim_requests, simulate
from autotune.tuning.search.parallelism import tp_candidates
from autotune.tuning.search.space import SpaceBounds, max_model_len_candidates
from autotune.workload.build import scale_rate
from autotune.workload.core import Workload
from autotune.workload.profile import WorkloadProfile

__all__ = [
    "FreshLengths",
    "Screening",
    "baseline_engine_args",
    "build_bounds",
    "cover_baseline",
    "estimate_peak_concurrency",
    "fixed_kv_bytes",
    "longest_candidate_warning",
    "model_of",
    "overlength_rate",
    "screen_max_model_len",
]


class _HasModel(Protocol):  # a study config or a nightly config
    @property
    def model(self) -> ModelConfig: ...


def model_of(cfg: _HasModel) -> ModelProfile:
    """The config's model profile: its ``config.json`` when given, else the named profile
    (the one place a config's model becomes a :class:`ModelProfile`)."""
    if cfg.model.config_json:
        return load_model_config(cfg.model.config_json, name=cfg.model.name)
    return get_model(cfg.model.name)


# The largest max_model_len candidate (the baseline's) draws a warning when fewer than this
# share of the requests need it, i.e. do not fit the next candidate below it
# (docs/tuning.md#8-the-staged-plan): at the default margin the candidates are p95, p99 and
# the max, so 1 % of the requests or fewer lie above the p99 candidate by construction, and
# the max alone is the outlier's. It only warns when that candidate is also at least
# TAIL_RATIO times the next: a max a little above p99 is an ordinary tail, not an outlier.
TAIL_SHARE = 0.01
TAIL_RATIO = 2.0

# max_num_seqs search range when nothing else is known (configurable per study)
_MNS_FLOOR = 8
_MNS_CAP = 4096


def baseline_engine_args(
    model: ModelProfile, hw: HardwareProfile, max_model_len: int
) -> dict[str, Any]:
    """vLLM's defaults for the GPU class (``vllm serve``,
    docs/vllm.md#11-batch-defaults-per-gpu-class), with max_model_len from the workload: the
    seed guide's "baseline before any change" (docs/method.md#2-baseline-before-any-change)."""
    r = EngineArgs(max_model_len=max_model_len).resolve(model, hw)
    return {
        "max_model_len": r.max_model_len,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens,
    }


def estimate_peak_concurrency(
    model: ModelProfile, hw: HardwareProfile, wl: Workload, max_model_len: int, scale: float = 1.0
) -> int:
    """Requests in the engine at once (running + waiting) when the workload is replayed at
    ``scale`` times its rate on vLLM's defaults, simulated in-process (milliseconds)."""
    if wl.closed_loop_concurrency is not None:
        return wl.closed_loop_concurrency
    try:
        res = simulate(
            model,
            hw,
            EngineArgs(max_model_len=max_model_len),
            sim_requests(scale_rate(wl, scale)),
            jitter_cv=0.0,
        )
    except SimStartupError:
        return 0  # the defaults do not even start: no estimate, use the fallback range
    tl = res.timeline
    return int((tl.running + tl.waiting).max()) if len(tl.t) else 0


def _rng(spec: RangeSpec, lo: float, hi: float) -> tuple[float, float]:
    return (spec.low if spec.low is not None else lo, spec.high if spec.high is not None else hi)


def build_bounds(
    cfg: StudyConfig, model: ModelProfile, prof: WorkloadProfile, peak_concurrency: int
) -> SpaceBounds:
    s = cfg.search
    if s.max_model_len.candidates:
        cands = tuple(sorted(set(s.max_model_len.candidates)))
    else:
        t = prof.total_len
        cands = max_model_len_candidates(
            math.ceil(t.p95),
            math.ceil(t.p99),
            int(t.max),
            margin=s.max_model_len_margin,
            model_max=model.max_position_embeddings,
        )
        if s.max_model_len.low is not None or s.max_model_len.high is not None:
            lo, hi = _rng(s.max_model_len, 1, model.max_position_embeddings)
            cands = tuple(c for c in cands if lo <= c <= hi) or (int(hi),)
    if max(cands) > model.max_position_embeddings:
        raise ConfigError(
            f"search.max_model_len: candidate {max(cands)} exceeds the model's "
            f"maximum ({model.max_position_embeddings})",
            field=("search", "max_model_len"),
        )
    util_lo, util_hi = _rng(s.gpu_memory_utilization, 0.80, 0.97 if cfg.mode == "offline" else 0.95)
    peak = cfg.workload.peak_concurrency or peak_concurrency
    parallel = tuple(tp_candidates(model, s.parallelism)) if s.parallelism else ()
    if parallel:
        # a server of k devices is offered k copies of the load (per device), so it holds
        # k times the peak: the ceiling is the largest size's
        # (docs/tuning.md#16-the-parallelism-stage)
        peak *= max(parallel)
    mns_hi_default = min(_MNS_CAP, max(2 * peak, 2 * _MNS_FLOOR)) if peak else 1024
    mns_lo, mns_hi = _rng(s.max_num_seqs, _MNS_FLOOR, mns_hi_default)
    mnbt_lo, mnbt_hi = _rng(s.max_num_batched_tokens, 256, 65536)
    extras = tuple((e.name, tuple(e.choices)) for e in s.extra)
    static = cfg.worker.static_args
    try:
        return SpaceBounds(
            max_model_len_candidates=cands,
            util_low=float(util_lo),
            util_high=float(util_hi),
            mns_low=int(mns_lo),
            mns_high=int(max(mns_hi, mns_lo)),
            mnbt_low=int(mnbt_lo),
            mnbt_high=int(mnbt_hi),
            enable_chunked_prefill=bool(static.get("enable_chunked_prefill", True)),
            extras=extras,
            kv_cache_memory_bytes=fixed_kv_bytes(static),
            parallel=parallel,
        )
    except ValueError as exc:
        raise ConfigError(f"search: {exc}", field=("search",)) from exc


def fixed_kv_bytes(static_args: Mapping[str, Any]) -> str | None:
    """``kv_cache_memory_bytes`` as ``worker.static_args`` writes it (any spelling of the
    flag) when it fixes the KV cache's size, else None. vLLM then gives the KV cache exactly
    those bytes and skips the profiling that the utilization fraction feeds; the fraction only
    sets how much free memory the start demands
    (docs/vllm.md#13-what-the-memory-utilization-fraction-means). vLLM tests the value's
    truth: 0 means unset."""
    for key, value in static_args.items():
        if flag_key(key) == "kv_cache_memory_bytes" and value not in (None, False, 0, "0", ""):
            return str(value)
    return None


# the workers that serve trials with the simulator create estimates the peak with
SIM_WORKERS = ("sim-virtual", "sim")


def _peak_source(cfg: StudyConfig) -> tuple[str, bool]:
    """Where ``create``'s peak concurrency comes from, and whether it holds for the study's
    worker: a simulated peak is the simulator's own figure, exact for a simulated worker but
    only an estimate of a real server (the hardware profile may be far from it)."""
    if cfg.workload.peak_concurrency:
        return "as workload.peak_concurrency says", True
    if cfg.workload.arrival == "closed":
        return "the closed loop's concurrency", True
    at = "the baseline's capacity" if cfg.mode == "slo-capacity" else "the workload's rate"
    return f"simulated at {at}", cfg.worker.kind in SIM_WORKERS


def _fmt(v: float) -> str:
    return f"{v:g}"


def cover_baseline(
    b: SpaceBounds, baseline: Mapping[str, Any], cfg: StudyConfig, peak: int
) -> tuple[SpaceBounds, list[str]]:
    """The bounds with every default range reaching the baseline's value, and a note for
    each range that still excludes it (docs/tuning.md#8-the-staged-plan):

    - a range the config sets (``search.<param>.low``/``high``) is the user's: kept, noted;
    - the default ``max_num_seqs`` ceiling, when a peak concurrency that holds for this
      worker sets it (:func:`_peak_source`), is kept and noted: the engine never held more
      than ``peak`` requests, so every value above the ceiling acts as the ceiling does and
      trials there would be wasted (an edge the best trial reaches widens,
      ``autotune/tuning/search/edges.py``);
    - any other default range is extended to the baseline's value.

    ``max_model_len`` needs nothing: the baseline's is the longest candidate."""
    s = cfg.search
    where, holds = _peak_source(cfg)
    notes: list[str] = []
    ranges = {
        "gpu_memory_utilization": (s.gpu_memory_utilization, b.util_low, b.util_high),
        "max_num_seqs": (s.max_num_seqs, b.mns_low, b.mns_high),
        "max_num_batched_tokens": (s.max_num_batched_tokens, b.mnbt_low, b.mnbt_high),
    }
    out: dict[str, tuple[float, float]] = {}
    for param, (spec, lo, hi) in ranges.items():
        v = float(baseline[param])
        rng = f"{_fmt(lo)}..{_fmt(hi)}"
        mine = (v < lo and spec.low is not None) or (v > hi and spec.high is not None)
        if mine:
            notes.append(
                f"search.{param} {rng}, set in the config, excludes the baseline's {_fmt(v)}: "
                f"the baseline still runs at {_fmt(v)}; the {param} stages search {rng} only"
            )
        elif v > hi and param == "max_num_seqs" and peak and holds:
            notes.append(
                f"max_num_seqs {rng} excludes the baseline's {_fmt(v)}: the engine held at "
                f"most {peak} requests ({where}), so above {_fmt(hi)} max_num_seqs does not "
                f"bind and acts as {_fmt(hi)} does; the baseline still runs at {_fmt(v)}, and "
                "the ceiling moves out if the best trial reaches it"
            )
        else:
            lo, hi = min(lo, v), max(hi, v)
        out[param] = (lo, hi)
    covered = replace(
        b,
        util_low=out["gpu_memory_utilization"][0],
        util_high=out["gpu_memory_utilization"][1],
        mns_low=int(out["max_num_seqs"][0]),
        mns_high=int(out["max_num_seqs"][1]),
        mnbt_low=int(out["max_num_batched_tokens"][0]),
        mnbt_high=int(out["max_num_batched_tokens"][1]),
    )
    return covered, notes


def overlength_rate(max_model_len: int, prompt: Sequence[int], output: Sequence[int]) -> float:
    """The share of requests ``max_model_len`` does not fit: refused (the prompt alone
    reaches it) or served cut short (prompt + output beyond it), the two parts of the
    over-length rate (docs/tuning.md#3-the-per-level-record)."""
    if not prompt:
        return 0.0
    over = sum(
        1
        for p, o in zip(prompt, output, strict=True)
        if p >= max_model_len or p + o > max_model_len
    )
    return over / len(prompt)


@dataclass(frozen=True)
class FreshLengths:
    """The lengths of the validation phase's fresh samples, pooled: the phase judges each
    config's over-length rate on exactly these, so they are known before any launch
    (docs/tuning.md#8-the-staged-plan, "Before any launch")."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    samples: int  # how many samples the lengths pool


@dataclass(frozen=True)
class Screening:
    """The ``max_model_len`` candidates the workload allows (pure data, stored in the plan)."""

    kept: tuple[int, ...]
    rates: dict[int, float] = field(default_factory=dict)  # every candidate's over-length rate
    limit: float = 0.0
    # the same rates pooled over validation's fresh samples (empty: validation off)
    fresh_rates: dict[int, float] = field(default_factory=dict)
    fresh_requests: int = 0
    fresh_samples: int = 0

    @property
    def dropped(self) -> tuple[int, ...]:
        return tuple(c for c in sorted(self.rates) if c not in self.kept)

    def why(self, c: int) -> str:
        """Why candidate ``c`` was dropped, in words."""
        if self.rates[c] > self.limit:
            return (
                f"{self.rates[c]:.2%} of the workload's requests do not fit "
                f"(limit {self.limit:.2%})"
            )
        return (
            f"{self.fresh_rates[c]:.2%} of the {self.fresh_requests:,} requests of "
            f"validation's {self.fresh_samples} fresh samples do not fit (limit "
            f"{self.limit:.2%}; {self.rates[c]:.2%} of the workload's own), so validation "
            "would refuse it"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "kept": list(self.kept),
            "dropped": [
                {
                    "max_model_len": c,
                    "overlength_rate": self.rates[c],
                    **(
                        {"fresh_overlength_rate": self.fresh_rates[c]}
                        if c in self.fresh_rates
                        else {}
                    ),
                    "why": self.why(c),
                }
                for c in self.dropped
            ],
        }


def screen_max_model_len(
    candidates: Sequence[int],
    prompt: Sequence[int],
    output: Sequence[int],
    limit: float,
    fresh: FreshLengths | None = None,
) -> Screening:
    """Drop the candidates whose over-length rate on the workload breaks ``limit``: they
    would fail the over-length constraint at every load, so launching them wastes a trial.
    Raises :class:`ConfigError` when none is left.

    With ``fresh`` (validation's samples), a candidate whose rate pooled over them breaks
    the limit is dropped too: validation would refuse it whatever it gained (a candidate
    sized at the workload's p99 sits at a 1 % limit by construction). The longest candidate
    left, the baseline's, is kept whatever those samples say: validation judges the baseline
    by the same rule, and a baseline that breaks it is the verdict's to name."""
    rates = {int(c): overlength_rate(int(c), prompt, output) for c in candidates}
    kept = tuple(c for c in sorted(rates) if rates[c] <= limit)
    if not kept:
        best = max(rates)
        raise ConfigError(
            f"search.max_model_len: every candidate breaks slo.max_overlength_rate "
            f"({limit:.2%}) on this workload; the longest, {best}, leaves "
            f"{rates[best]:.2%} of the requests over-length. Add a longer candidate (the "
            "workload's longest prompt + output needs "
            f"{max(p + o for p, o in zip(prompt, output, strict=True))}) or raise "
            "slo.max_overlength_rate",
            field=("search", "max_model_len"),
        )
    if fresh is None or not fresh.prompt:
        return Screening(kept, rates, limit)
    fresh_rates = {c: overlength_rate(c, fresh.prompt, fresh.output) for c in rates}
    kept = tuple(c for c in kept if fresh_rates[c] <= limit or c == kept[-1])
    return Screening(kept, rates, limit, fresh_rates, len(fresh.prompt), fresh.samples)


def longest_candidate_warning(
    candidates: Sequence[int], prompt: Sequence[int], output: Sequence[int]
) -> str | None:
    """A warning when the largest candidate, the baseline's ``max_model_len``, is set by
    fewer than :data:`TAIL_SHARE` of the requests and is :data:`TAIL_RATIO` or more times
    the next candidate; None otherwise. One 31,000-token request among 400 whose p99 is
    6,155 tokens once made the baseline 34,560 without a word."""
    cands = sorted(set(candidates))
    if len(cands) < 2 or not prompt:
        return None
    top, nxt = cands[-1], cands[-2]
    need = sum(1 for p, o in zip(prompt, output, strict=True) if p >= nxt or p + o > nxt)
    share = need / len(prompt)
    if share >= TAIL_SHARE or top < TAIL_RATIO * nxt:
        return None
    return (
        f"max_model_len candidate {top} is set by {need} of {len(prompt)} requests "
        f"({share * 100:.2f} %): the baseline runs at it although the next candidate, "
        f"{nxt}, fits the other {len(prompt) - need}. To size for those, set "
        f"search.max_model_len.high: {nxt} (the {need} then count as over-length against "
        "slo.max_overlength_rate)"
    )
