"""The staged plan: how many trials each stage gets, decided from the baseline (pure; no I/O).

The seed guide's method (docs/method.md#3-reading-the-bottleneck) is: measure the baseline,
name the bottleneck from its metrics, change the one variable that addresses it. Every
parameter stage has a nominal budget of ``strategy.trials_per_stage`` trials; a stage that
cannot use its trials gives them to the stages the baseline's diagnosis points at
(docs/tuning.md#8-the-staged-plan):

- ``max_model_len`` tries each candidate other than the baseline's (the over-length screening
  at ``create`` has already dropped those that break the limit);
- ``gpu_memory_utilization`` gets no trial when ``kv_cache_memory_bytes`` fixes the KV
  cache's size (the fraction then sizes nothing), nor when the baseline shows that memory is
  not the bottleneck: KV usage below :data:`KV_NOT_BOTTLENECK` at every level it replayed and no
  preemption. More memory only buys KV blocks, and a cache that never filled has blocks to
  spare; the trials go where the bottleneck is. When memory is the bottleneck the stage tries
  the top of the range first and closes after it when it is best (:func:`_top_best`);
- in a study that searches the parallelism, every other size is measured again at the tuned
  point before the joint refinement (``tensor_parallel_size.2``); a size that ties there
  becomes the one the later stages tune, and the joint refinement's trials then go to the
  coordinate passes (:mod:`autotune.tuning.search.home_size`);
- after the joint refinement, ``max_model_len`` is tried again at the tuned concurrency
  (``max_model_len.2``: each other candidate once);
- then coordinate passes revisit the two concurrency knobs, which interact, until the trial
  budget is spent: the trials saved above go there, on the parameters the diagnosis points at
  (the token budget first in each pass when the baseline is token-budget-bound or p99 TPOT
  is the SLO that binds its capacity, else ``max_num_seqs`` first, the fixed order).

Every controller of a study derives the same plan from the same trials, so the plan is never
stored as state that could disagree; ``autotune study show`` prints it with the reasons.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from autotune.config import StrategyConfig
from autotune.loadgen.stopped import StopInfo
from autotune.tuning.attrs import (
    BaselineEvidence,
    baseline_evidence,
    engine_value,
    label_of,
    stage_of,
)
from autotune.tuning.search.home_size import RECHECK, moved, unfit_sizes
from autotune.tuning.search.ranking import TIE
from autotune.tuning.search.space import MNBT_PARAM, TP_PARAM, SpaceBounds

__all__ = [
    "CONCURRENCY",
    "FLAT",
    "KV_NOT_BOTTLENECK",
    "MemoryEvidence",
    "Stage",
    "at_top",
    "baseline_trial",
    "capacity_bracket",
    "choices_of",
    "evidence_of",
    "memory_evidence",
    "memory_verdict",
    "plan_lines",
    "stage_param",
    "stage_params",
    "stage_plan",
]


# Peak KV usage below which memory is not what limits the baseline (the seed guide's rule,
# docs/method.md: KV usage near 100 % or preemptions mean memory pressure). Usage moves in whole
# blocks and the scheduler preempts before the last one is taken (KV_FULL in
# telemetry/diagnosis.py is 95 %); 80 % leaves a margin for a peak between two samples.
KV_NOT_BOTTLENECK = 0.80
# A memory stage whose first trials all score within 0.2 % of one another (and of the point it
# started from) has shown that memory changes nothing here: it closes early.
FLAT = 0.002
# what the coordinate passes revisit, and all the staged joint refinement moves
CONCURRENCY = ("max_num_seqs", MNBT_PARAM)


def stage_param(stage: str) -> tuple[str, int]:
    """(parameter, pass) of a stage label: ``max_num_seqs`` is pass 1, ``max_num_seqs.2``
    the second coordinate pass over it."""
    name, _, k = stage.rpartition(".")
    if name and k.isdigit():
        return name, int(k)
    return stage, 1


def capacity_bracket(levels: Sequence[Any]) -> list[Any]:
    """The levels that decide a capacity: those up to the highest feasible one and the
    lowest infeasible one above it. The capacity search opens at the lattice's top (16x the
    rate in the quickstart), where the queue grows without bound and any cache fills; that
    level says nothing about whether memory limits the capacity, so the memory rule reads
    the bracket (every level when none met the SLOs). A level stopped early
    (docs/tuning.md#10-early-stop-inside-a-level) replayed only its start, so its peak KV
    usage is not the level's: it is left out."""
    levels = [lv for lv in levels if StopInfo.of(getattr(lv, "metrics", None)) is None]
    feasible = [lv for lv in levels if lv.feasible]
    if not feasible:
        return list(levels)
    top = max(lv.scale for lv in feasible)
    out = [lv for lv in levels if lv.scale <= top]
    above = [lv for lv in levels if lv.scale > top]
    if above:
        out.append(min(above, key=lambda lv: lv.scale))
    return out


def stage_params(b: SpaceBounds) -> list[str]:
    """Sampler parameter names, one stage each, in the fixed order (extras last); the
    parallelism first when the study searches it (docs/tuning.md#16-the-parallelism-stage)."""
    return [
        *((TP_PARAM,) if b.parallel else ()),
        "max_model_len",
        "gpu_memory_utilization",
        "max_num_seqs",
        MNBT_PARAM,
        *(name for name, _ in b.extras),
    ]


@dataclass(frozen=True)
class MemoryEvidence:
    """What a trial's levels say about memory: the highest KV usage sampled at any level
    (None: no level had KV telemetry) and the preemptions over all of them."""

    kv_peak: float | None
    preemptions: float | None
    levels: int

    def bottleneck(self) -> tuple[bool | None, str]:
        """(is memory the bottleneck, why); None when the telemetry cannot tell."""
        if self.levels == 0 or self.kv_peak is None or self.preemptions is None:
            return None, "the baseline has no KV-usage or preemption telemetry"
        if self.kv_peak < KV_NOT_BOTTLENECK and self.preemptions == 0:
            return False, (
                f"peak KV usage {self.kv_peak:.0%} < {KV_NOT_BOTTLENECK:.0%} at every one of "
                f"the baseline's {self.levels} levels and 0 preemptions: memory is not the "
                "bottleneck"
            )
        return True, (
            f"the baseline's peak KV usage is {self.kv_peak:.0%} with "
            f"{self.preemptions:.0f} preemptions: memory is under pressure"
        )


def memory_evidence(diagnoses: Iterable[Mapping[str, Any] | None]) -> MemoryEvidence:
    """From the levels' stored diagnoses (their ``evidence``: ``kv_usage_max``,
    ``preemptions``)."""
    peaks: list[float] = []
    pre: list[float] = []
    n = 0
    for d in diagnoses:
        n += 1
        ev = (d or {}).get("evidence") or {}
        if "kv_usage_max" in ev:
            peaks.append(float(ev["kv_usage_max"]))
        if "preemptions" in ev:
            pre.append(float(ev["preemptions"]))
    return MemoryEvidence(
        kv_peak=max(peaks) if len(peaks) == n and n else None,
        preemptions=sum(pre) if len(pre) == n and n else None,
        levels=n,
    )


@dataclass(frozen=True)
class Stage:
    name: str  # the stage label trials carry (the parameter's name)
    budget: int
    why: str = ""


def baseline_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The study's baseline trial, in whatever state (the latest retry)."""
    found = [t for t in trials if label_of(t) == "baseline"]
    return found[-1] if found else None


def choices_of(b: SpaceBounds, param: str) -> tuple[Any, ...] | None:
    """A categorical parameter's choices (its stage enumerates them instead of sampling);
    None for a numeric one."""
    if param == "max_model_len":
        return b.max_model_len_candidates
    if param == TP_PARAM and b.parallel:
        return b.parallel
    return dict(b.extras).get(param)


def _flat(trials: Sequence[FrozenTrial], stage: str) -> int | None:
    """How many trials a stage ran before its line proved flat (None: not flat, or too
    early to tell): at least two complete trials, every one within :data:`FLAT` of the
    others and of the best trial before the stage."""
    mine = [t for t in trials if stage_of(t) == stage]
    if len(mine) < 2 or any(t.value is None or not t.state.is_finished() for t in mine):
        return None
    first = min(t.number for t in mine)
    before = [t.value for t in trials if t.number < first and t.value is not None]
    vals = [float(t.value) for t in mine if t.value is not None]
    if before:
        vals.append(float(max(before)))
    lo, hi = min(vals), max(vals)
    return len(mine) if hi > 0 and (hi - lo) / hi <= FLAT else None


def at_top(value: float, top: float) -> bool:
    """Is a ``gpu_memory_utilization`` value the range's top (values step by 0.01)?"""
    return abs(value - top) < 5e-3


def _top_best(trials: Sequence[FrozenTrial], stage: str, top: float) -> int | None:
    """How many trials the memory stage ran before its trial at the top of the range
    (``top``) proved best (None: not yet). More memory only adds KV blocks, so capacity does
    not fall as ``gpu_memory_utilization`` rises: once the top scores within :data:`TIE`
    of every trial so far, lower values cannot beat it and the stage's other trials go to the
    concurrency passes. The top can still lose (a launch that runs out of memory on a real
    GPU, noise): then the stage goes on with its line search."""
    mine = [t for t in trials if stage_of(t) == stage]
    if any(not t.state.is_finished() for t in mine):
        return None
    tops = [
        t
        for t in mine
        if t.value is not None
        and all(v <= 0 for v in t.constraints.values())
        and at_top(float(engine_value(t, stage, -1)), top)
    ]
    if not tops:
        return None
    best = max(float(t.value) for t in tops if t.value is not None)
    # judged against what the stage knew (trials before it and its own), so that later
    # stages' better trials cannot reopen it: a plan every controller derives alike
    first = min(t.number for t in mine)
    others = [
        float(t.value)
        for t in trials
        if t.value is not None and t not in tops and (t.number < first or stage_of(t) == stage)
    ]
    if others and best < max(others) * (1.0 - TIE):
        return None
    return len(mine)


def evidence_of(trials: Sequence[FrozenTrial]) -> BaselineEvidence | None:
    """What the baseline recorded for the plan, None until it has completed with a value."""
    base = baseline_trial(trials)
    done = base is not None and base.state.is_finished() and base.value is not None
    return baseline_evidence(base) if done and base is not None else None


def stage_plan(
    trials: Sequence[FrozenTrial],
    st: StrategyConfig,
    b: SpaceBounds,
    evidence: BaselineEvidence | None = None,
) -> list[Stage]:
    """The staged strategy's parameter stages with their budgets, in order: the first pass
    over every parameter in the fixed order, then coordinate passes over the concurrency
    pair until the trial budget (less the joint refinement) is spent. ``evidence``: what the
    completed baseline recorded (by default :func:`evidence_of` the trials); before the
    baseline has completed, the memory stage keeps its nominal budget (provisional: no later
    stage is claimed while the baseline runs, docs/parallel.md)."""
    tps = st.trials_per_stage
    base = baseline_trial(trials)
    ev = evidence if evidence is not None else evidence_of(trials)
    out: list[Stage] = []
    saved = 0
    for p in stage_params(b):
        if p == TP_PARAM and b.parallel:
            # the baseline ran the smallest size: the stage tries each other one once, and
            # the stages after it run inside the best (per device) of them
            sizes = len(b.parallel) - 1
            out.append(Stage(p, sizes, f"{sizes} tensor-parallel size(s) besides 1"))
        elif p == "max_model_len":
            # a queued baseline has no params yet: its engine attribute says it
            base_mml = (
                (base.params.get(p) or engine_value(base, p)) if base is not None else None
            ) or max(b.max_model_len_candidates)
            others = [c for c in b.max_model_len_candidates if c != base_mml]
            n = min(tps, len(others))
            why = (
                f"{len(others)} candidate(s) besides the baseline's {base_mml}"
                if others
                else f"the baseline's {base_mml} is the only candidate left"
            )
            out.append(Stage(p, n, why))
            saved += tps - n
        elif p == "gpu_memory_utilization" and b.kv_cache_memory_bytes is not None:
            # the KV cache's size is fixed in bytes: the fraction sizes nothing, so no trial
            # is spent on it, before or after the baseline (docs/tuning.md#8-the-staged-plan)
            why = (
                f"skipped: worker.static_args.kv_cache_memory_bytes {b.kv_cache_memory_bytes} "
                "fixes the KV cache's size, so gpu_memory_utilization changes nothing"
            )
            out.append(Stage(p, 0, why))
            saved += tps
        elif p == "gpu_memory_utilization":
            verdict, why = memory_verdict(ev) if ev is not None else (None, "provisional")
            n = 0 if verdict is False else tps
            ran = _flat(trials, p) if n else None
            if ran is not None and ran < n:
                n, why = ran, f"{why}; closed after {ran}: memory changed nothing"
            top = _top_best(trials, p, b.util_high) if n else None
            if top is not None and top < n:
                n, why = top, f"{why}; closed after {top}: the top of the range is best"
            out.append(Stage(p, n, why))
            saved += tps - n
        elif p in CONCURRENCY:
            out.append(Stage(p, tps, "nominal"))
        else:
            choices = choices_of(b, p) or ()
            out.append(Stage(p, min(tps, len(choices)), f"{len(choices)} choice(s)"))
    # Coordinate passes: the two concurrency knobs interact (a smaller token budget shortens
    # every decode step, so more sequences fit the TPOT SLO), and the first pass tuned
    # max_num_seqs at the baseline's token budget; each pass revisits both, within a factor
    # strategy.POLISH (sqrt 2) of the best point's value (docs/tuning.md#8-the-staged-plan).
    # The trials the first pass saved (``saved``) are spent here, on the concurrency knobs,
    # in the order the baseline points at (below).
    pair = CONCURRENCY
    if ev is not None and (ev.diagnosis == "token-budget-bound" or ev.binding_slo == "p99_tpot"):
        # the token budget first: the baseline's steps bind it, or p99 TPOT is the SLO that
        # binds its capacity, and a smaller budget shortens every step a decode waits on
        # (the seed guide's FAQ: a large budget lengthens each step and worsens decode latency)
        pair = (MNBT_PARAM, "max_num_seqs")
    joint = st.joint_refinement
    if len(b.parallel) > 1:
        # pass 1 chose the size at the baseline's concurrency; a size's best knobs differ
        # (the 8B-on-2xH100 scenario: TP 2 won at the defaults, TP 1 once tuned), so the
        # other sizes are measured again at the tuned point, before the joint refinement,
        # and a size that ties there becomes the one the later stages tune; one that could
        # not start for memory is skipped (docs/tuning.md#16-the-parallelism-stage)
        unfit = unfit_sizes(trials)
        why = "re-checked at the tuned concurrency (pass 1 ran at the baseline's)"
        if unfit:
            skipped = ", ".join(map(str, sorted(unfit)))
            why += f"; skipped TP {skipped}: no memory for it at this gpu_memory_utilization"
        out.append(Stage(RECHECK, len(b.parallel) - 1 - len(unfit), why))
        if joint and moved(trials):
            joint = 0  # its trials go to the coordinate passes (autotune.tuning.search.home_size)
    if joint:
        # a short joint phase first: compass moves from the best point follow the ridge along
        # which the two knobs trade off, which coordinate moves cross only slowly
        # (autotune.tuning.search.pattern); the passes then polish
        out.append(Stage("joint", joint, "joint refinement (compass moves from the best point)"))
    alternatives = len(b.max_model_len_candidates) - 1
    if alternatives > 0:
        # pass 1 judged max_model_len at the baseline's concurrency, where the queue, not
        # the few longest requests a smaller max_model_len turns away, set the latency; at
        # the tuned concurrency the choice can differ (long-context scenario: +4 % capacity)
        out.append(
            Stage(
                "max_model_len.2",
                min(tps, alternatives),
                "re-checked at the tuned concurrency (pass 1 ran at the baseline's)",
            )
        )
    queued = len({label_of(t) for t in trials} - {None}) or 1
    left = st.n_trials - queued - sum(s.budget for s in out)
    per = max(2, (tps + 1) // 2)
    k = 2
    while left > 0:
        for p in pair:
            n = min(per, left)
            if n > 0:
                why = f"coordinate pass {k}" + (f" ({saved} saved by pass 1)" if saved else "")
                out.append(Stage(f"{p}.{k}", n, why))
                left -= n
        k += 1
    return out


def memory_verdict(ev: BaselineEvidence) -> tuple[bool | None, str]:
    """Is memory the baseline's bottleneck (from what it recorded)?"""
    mem = MemoryEvidence(kv_peak=ev.kv_usage_peak, preemptions=ev.preemptions, levels=ev.levels)
    return mem.bottleneck()


def plan_lines(
    trials: Sequence[FrozenTrial],
    st: StrategyConfig,
    b: SpaceBounds,
    screening: Mapping[str, Any] | None,
) -> list[str]:
    """The plan as ``study create`` and ``study show`` print it: what was dropped before any
    launch and why, then each stage with its budget and the reason for it."""
    lines = []
    for d in (screening or {}).get("dropped", []):
        lines.append(f"max_model_len {d['max_model_len']} dropped before any launch: {d['why']}")
    if st.name != "staged":
        lines.append(f"strategy {st.name}: {st.n_trials} trials, baseline first")
        return lines
    parts = [f"{s.name} {s.budget} ({s.why})" for s in stage_plan(trials, st, b)]
    lines.append(f"stages (at most {st.n_trials} trials, baseline first): " + "; ".join(parts))
    return lines
