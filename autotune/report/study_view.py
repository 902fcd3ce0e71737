"""What a study's report says, computed from stored records (pure; no I/O, no plotting).

The HTML report, the Markdown summary and the optuna-dashboard notes all read this module:
the study's details (autotune, vLLM, GPU, model, workload, seed), the baseline comparison,
the fixed-order history stage by stage (docs/report.md#2-the-html-report), the Pareto front
of throughput against latency, and parameter importances on engine values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.config import StudyConfig
from autotune.report.recommend import Recommendation, gain_text, recommend
from autotune.store import LevelRecord, RepeatRecord, StudyRecord, TrialRecord
from autotune.tuning.measure.cost import StudyCost, study_cost
from autotune.tuning.measure.findings import capacity_rps
from autotune.tuning.measure.noise import NoiseRecord

__all__ = [
    "ENGINE_KEYS",
    "StageStep",
    "StudyView",
    "baseline_comparison",
    "details",
    "engine_value_importances",
    "pareto_front",
    "stage_history",
    "study_view",
]

# The tuned engine args, in the fixed order
# (docs/method.md#4-one-variable-at-a-time-in-a-fixed-order)
ENGINE_KEYS = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")

# Why each stage of the staged strategy moves its parameter, in the seed guide's terms
_STAGE_WHY = {
    "baseline": "vLLM's defaults for this GPU class, measured first with the same protocol",
    "max_model_len": "sized from the workload's real lengths (p95, p99, max plus margin): "
    "a shorter context frees KV-cache memory",
    "gpu_memory_utilization": "more of the GPU's memory for the KV cache",
    "max_num_seqs": "the concurrency cap: how many requests share a step",
    "max_num_batched_tokens": "the per-step token budget: prefill chunking against decode latency",
    "joint": "staged: the two concurrency knobs together, moved from the best point so far; "
    "the joint strategy: every parameter by multivariate TPE",
    "random": "independent uniform draws over the whole space",
    "grid": "a log grid over max_num_seqs x max_num_batched_tokens",
}


@dataclass
class StudyView:
    """One study as the report sees it: its record, config, trials and recommendation."""

    record: StudyRecord
    cfg: StudyConfig
    trials: list[TrialRecord]
    rec: Recommendation | None
    cost: StudyCost  # device time of every worker (docs/cost.md)

    @property
    def complete(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.state == "COMPLETE"]

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.complete if t.stage == "baseline"), None)


def study_view(
    record: StudyRecord,
    cfg: StudyConfig,
    trials: list[TrialRecord],
    repeats: list[RepeatRecord] | None = None,
    noise: NoiseRecord | None = None,
) -> StudyView:
    """``repeats``: the validation runs (``Store.repeats``), for the gain's interval."""
    rec = recommend(cfg, trials, repeats, noise)
    return StudyView(record, cfg, trials, rec, study_cost(trials, repeats or ()))


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def details(view: StudyView) -> list[tuple[str, str]]:
    """The study's provenance as (label, value) rows."""
    from autotune import __version__

    cfg, prof = view.cfg, view.record.workload_profile
    wl = cfg.workload
    kind = cfg.worker.kind
    if kind == "vllm":
        vllm = f"vllm serve ({' '.join(cfg.worker.vllm_executable)}; version not recorded)"
    else:
        from autotune.sim import ENGINE_MODEL_VERSION, VLLM_VERSION

        vllm = (
            f"simulated vLLM {VLLM_VERSION} (worker {kind}, engine model "
            f"v{ENGINE_MODEL_VERSION}); not a measurement of real vLLM"
        )
    lens = ""
    if isinstance(prof.get("prompt_len"), dict) and isinstance(prof.get("output_len"), dict):
        lens = (
            f", prompt p50 {prof['prompt_len'].get('p50', 0):,.0f} / p99 "
            f"{prof['prompt_len'].get('p99', 0):,.0f} tokens, output p50 "
            f"{prof['output_len'].get('p50', 0):,.0f} / p99 "
            f"{prof['output_len'].get('p99', 0):,.0f} tokens"
        )
    load = (
        f"{wl.arrival} at {wl.rate:g} req/s"
        if wl.rate is not None
        else f"{wl.arrival}" + (f", concurrency {wl.concurrency}" if wl.concurrency else "")
    )
    slo = cfg.slo
    slos = ", ".join(
        x
        for x in (
            f"p99 TTFT <= {slo.p99_ttft_ms:g} ms" if slo.p99_ttft_ms is not None else "",
            f"p99 TPOT <= {slo.p99_tpot_ms:g} ms" if slo.p99_tpot_ms is not None else "",
            f"errors <= {100 * slo.max_error_rate:g} %",
            f"over-length <= {100 * slo.max_overlength_rate:g} %",
        )
        if x
    )
    st = cfg.strategy
    done = len(view.complete)
    return [
        ("autotune", __version__),
        ("vLLM", vllm),
        ("GPU", cfg.hardware),
        ("model", cfg.model.name),
        (
            "workload",
            f"{wl.source}, {prof.get('num_requests', wl.num_prompts)} requests{lens}; {load}",
        ),
        ("mode", cfg.mode),
        ("SLOs", slos),
        (
            "strategy",
            f"{st.name}, {done} of {st.n_trials} trials complete ({len(view.trials)} started)",
        ),
        ("cost", view.cost.text.removeprefix("cost: ")),
        ("seeds", f"study {cfg.seed}, workload {wl.seed}"),
        ("fingerprint", str(prof.get("fingerprint", "-"))),
    ]


def _headline(t: TrialRecord) -> LevelRecord | None:
    return t.headline_level()


def baseline_comparison(view: StudyView) -> list[tuple[str, str, str]]:
    """(what, baseline, recommended) rows; empty without both trials."""
    rec, base = view.rec, view.baseline
    if rec is None or base is None:
        return []
    best = rec.trial

    def cap(t: TrialRecord) -> str:
        rps = capacity_rps(t)
        bound = rec.capacity(t)
        if bound is not None and not bound.exact:  # a bound, docs/usage.md#1-commands
            return ("infeasible: " if bound.bound == "<" else "") + bound.text()
        if t.capacity_scale is None:
            return "infeasible" if t.feasible is False else "-"
        return f"x{t.capacity_scale:.3f}" + (f" ({rps:,.2f} req/s)" if rps is not None else "")

    figs = {(f.trial, f.baseline): f for f in rec.figures} if rec.validated else {}

    def validated(t: TrialRecord, baseline: bool) -> str:
        f = figs.get((t.optuna_trial_number, baseline)) or figs.get(
            (t.optuna_trial_number, not baseline)
        )
        if f is None:
            return "-"
        what = f.capacity.text() if f.capacity is not None else "-"
        return f"{what}; held {f.held.all_held} of {f.held.all_runs} runs"

    def lat(t: TrialRecord, key: str) -> str:
        lv = _headline(t)
        v = getattr(lv, key) if lv is not None else None
        return f"{v:,.1f} ms" if v is not None else "-"

    def diag(t: TrialRecord) -> str:
        return str((t.diagnosis or {}).get("kind") or "-")

    rows: list[tuple[str, str, str]] = [
        ("trial", str(base.optuna_trial_number), str(best.optuna_trial_number)),
    ]
    keys = [*ENGINE_KEYS, *sorted(set(best.engine_args) - set(ENGINE_KEYS))]
    for k in keys:
        rows.append((k, _fmt(base.engine_args.get(k)), _fmt(best.engine_args.get(k))))
    rows += [
        ("capacity", cap(base), cap(best)),
        (
            "output tok/s",
            f"{base.objective:,.1f}" if base.objective is not None else "-",
            f"{best.objective:,.1f}" if best.objective is not None else "-",
        ),
        ("p99 TTFT", lat(base, "p99_ttft_ms"), lat(best, "p99_ttft_ms")),
        ("p99 TPOT", lat(base, "p99_tpot_ms"), lat(best, "p99_tpot_ms")),
        (
            "KV cache tokens",
            f"{base.kv_cache_tokens:,}" if base.kv_cache_tokens else "-",
            f"{best.kv_cache_tokens:,}" if best.kv_cache_tokens else "-",
        ),
        ("bottleneck", diag(base), diag(best)),
        *(
            [("validated capacity", validated(base, True), validated(best, False))]
            if figs and view.cfg.mode == "slo-capacity"
            else []
        ),
        ("gain", "", gain_text(rec)),
    ]
    return rows


@dataclass
class StageStep:
    """One stage of the history: its trials, what it changed from the best point so far
    (``incumbent``) and why, and how it ended."""

    stage: str
    trials: list[int]
    why: str
    changed: str
    outcome: str
    incumbent: int | None
    best: int | None
    bottleneck: str | None = None
    tried: list[str] = field(default_factory=list)


def _objective(t: TrialRecord | None) -> float:
    return (t.objective or 0.0) if t is not None and t.feasible else -math.inf


def stage_history(view: StudyView) -> list[StageStep]:
    """Consecutive trials of one stage form one step, in trial order."""
    groups: list[list[TrialRecord]] = []
    for t in view.trials:
        if groups and groups[-1][0].stage == t.stage:
            groups[-1].append(t)
        else:
            groups.append([t])
    steps: list[StageStep] = []
    incumbent: TrialRecord | None = None
    for group in groups:
        stage = group[0].stage
        done = [t for t in group if t.state == "COMPLETE"]
        feasible = [t for t in done if t.feasible and t.objective is not None]
        best = max(
            feasible, key=lambda t: (t.objective or 0.0, -t.optuna_trial_number), default=None
        )
        why = _STAGE_WHY.get(stage, "a configuration from the study's enqueue list")
        bottleneck = None
        if incumbent is not None and incumbent.diagnosis:
            d = incumbent.diagnosis
            bottleneck = f"{d.get('kind')}: {d.get('suggestion') or ''}".rstrip(": ")
        moved = sorted(
            {
                k
                for t in group
                for k, v in t.engine_args.items()
                if incumbent is None or incumbent.engine_args.get(k) != v
            },
            key=lambda k: (ENGINE_KEYS.index(k) if k in ENGINE_KEYS else len(ENGINE_KEYS), k),
        )
        tried = [
            ", ".join(f"{k}={_fmt(t.engine_args.get(k))}" for k in moved) or "(same config)"
            for t in group
        ]
        if incumbent is None:
            changed = "the starting point"
        elif not moved:
            changed = "nothing (a repeat of the best point so far)"
        else:
            changed = ", ".join(
                f"{k} {_fmt(incumbent.engine_args.get(k))} -> "
                + "/".join(dict.fromkeys(_fmt(t.engine_args.get(k)) for t in group))
                for k in moved
            )
        if not done:
            outcome = "not complete"
        elif best is None:
            outcome = "no feasible trial"
        elif incumbent is None or _objective(best) > _objective(incumbent):
            gain = (
                f" ({100 * (best.objective or 0) / incumbent.objective - 100:+.1f} %)"
                if incumbent is not None and incumbent.feasible and incumbent.objective
                else ""
            )
            outcome = (
                f"new best: trial {best.optuna_trial_number}, {best.objective:,.1f} tok/s{gain}"
            )
            incumbent = best
        else:
            outcome = (
                f"no gain: best here {best.objective:,.1f} tok/s (trial "
                f"{best.optuna_trial_number}); kept trial {incumbent.optuna_trial_number}"
            )
        steps.append(
            StageStep(
                stage=stage,
                trials=[t.optuna_trial_number for t in group],
                why=why,
                changed=changed,
                outcome=outcome,
                incumbent=steps[-1].best if steps else None,
                best=incumbent.optuna_trial_number if incumbent is not None else None,
                bottleneck=bottleneck,
                tried=tried,
            )
        )
    return steps


def pareto_front(points: Sequence[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The (latency, throughput, trial) points no other point beats on both (lower latency,
    higher throughput), by ascending latency."""
    front: list[tuple[float, float, int]] = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


def engine_value_importances(trials: Sequence[TrialRecord]) -> list[tuple[str, float]]:
    """Each tuned engine arg's importance for the objective, by Optuna's default evaluator
    (PED-ANOVA) over the engine values the completed trials passed to vLLM, whatever the
    sampler's parameters are called. Empty with fewer than three such trials."""
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution

    done = [t for t in trials if t.state == "COMPLETE" and t.objective is not None]
    if len(done) < 3:
        return []
    names = [k for k in ENGINE_KEYS if all(k in t.engine_args for t in done)]
    names += sorted(
        {k for t in done for k in t.engine_args} - set(ENGINE_KEYS),
    )
    dists: dict[str, BaseDistribution] = {}
    for k in names:
        values = [t.engine_args.get(k) for t in done]
        if len({repr(v) for v in values}) < 2:
            continue  # held constant: no importance to measure
        nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(nums) == len(values):
            lo, hi = min(nums), max(nums)
            dists[k] = FloatDistribution(lo, hi, log=lo > 0 and hi / lo >= 4)
        else:
            dists[k] = CategoricalDistribution(sorted({str(v) for v in values}))
    if not dists:
        return []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line
    try:
        study = optuna.create_study(direction="maximize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    for t in done:
        params = {
            k: float(t.engine_args[k])
            if isinstance(d, FloatDistribution)
            else str(t.engine_args.get(k))
            for k, d in dists.items()
        }
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions=dists, value=t.objective)
        )
    imp = optuna.importance.get_param_importances(study)
    return sorted(((k, float(v)) for k, v in imp.items()), key=lambda kv: -kv[1])
