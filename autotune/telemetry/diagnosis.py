"""Naming a load level's bottleneck from its telemetry (pure; no I/O).

The rules follow the seed guide's step 2, "识别瓶颈类型" (identify the bottleneck type;
docs/method.md#3-reading-the-bottleneck): waiting piles up while running sits at
``max_num_seqs`` -> concurrency cap, raise ``max_num_seqs``; running not high but TTFT long ->
the per-step token budget, raise ``max_num_batched_tokens``; memory short and preemptions ->
overloaded, shrink. They rest first on evidence that survives missed mid-level scrapes (the
before/after deltas of counters and histograms: preemptions, the queue-time sum/count, the
iteration-tokens histogram) and use sampled gauges (KV usage, running vs. waiting) where they
exist. V1 logs no preemption line (docs/vllm.md#5-preemption-signals), so the preemption
counter is the memory signal.

Rule order: memory-bound, then a sampled concurrency cap, then queue time with step sizes, then
headroom; anything else is ``inconclusive`` with the reason in its suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.telemetry.summary import LevelTelemetry

__all__ = [
    "KINDS",
    "KV_FULL",
    "MIN_FINISHED",
    "NEAR_BUDGET_MIN",
    "QUEUE_HIGH_SHARE",
    "QUEUE_LOW_S",
    "QUEUE_LOW_SHARE",
    "SATURATED_MIN",
    "WELL_BELOW_BUDGET",
    "Diagnosis",
    "Kind",
    "diagnose",
]

Kind = Literal[
    "memory-bound", "token-budget-bound", "concurrency-capped", "headroom", "inconclusive"
]
KINDS: tuple[Kind, ...] = (
    "memory-bound",
    "token-budget-bound",
    "concurrency-capped",
    "headroom",
    "inconclusive",
)

# KV usage counted as full. Usage moves in whole blocks and vLLM preempts before the last one
# is taken, so a cache under pressure reads 0.95-1.0 (1.0 in the real bursts of
# docs/vllm.md#5-preemption-signals).
KV_FULL = 0.95
# Mean queue time as a share of mean e2e latency. Shares, not seconds: what is long differs
# by model and GPU by orders of magnitude, while an engine with room admits a request within a
# step or two, a tiny share of its life. At 20 % requests wait a fifth of their life.
QUEUE_HIGH_SHARE = 0.20
QUEUE_LOW_SHARE = 0.05
# A mean queue below 10 ms is about one engine step on any GPU: no queue, whatever its share.
QUEUE_LOW_S = 0.010
# Share of steps in the histogram bucket holding the budget: when at least half of the steps
# fill it, the budget is what bounds how much prefill each step admits.
NEAR_BUDGET_MIN = 0.5
# Mean tokens per step at most half the budget: the budget is not what stops admission.
WELL_BELOW_BUDGET = 0.5
# Sampled time share with running at max_num_seqs while requests wait. A burst touches the cap
# for a moment at its start; a quarter of the level is a cap, not a transient.
SATURATED_MIN = 0.25
# Fewer finished requests make the mean queue time one request's anecdote.
MIN_FINISHED = 3


@dataclass(frozen=True)
class Diagnosis:
    """The bottleneck, the numbers it rests on, and the next move."""

    kind: Kind
    evidence: dict[str, float] = field(default_factory=dict)
    suggestion: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "evidence": dict(self.evidence), "suggestion": self.suggestion}


def _evidence(
    tel: LevelTelemetry, max_num_seqs: int, max_num_batched_tokens: int
) -> dict[str, float]:
    ev: dict[str, float] = {
        "max_num_seqs": float(max_num_seqs),
        "max_num_batched_tokens": float(max_num_batched_tokens),
        "finished": tel.finished,
        "samples": float(tel.samples),
        "missed_scrapes": float(tel.missed_scrapes),
    }
    if tel.has_deltas and "preemptions" in tel.counters:
        ev["preemptions"] = tel.counters["preemptions"]
    for key in ("kv_usage", "running", "waiting"):
        if key in tel.gauges:
            ev[f"{key}_max"] = tel.gauges[key].max
            ev[f"{key}_mean"] = tel.gauges[key].time_weighted_mean
    if tel.saturated_fraction is not None and tel.max_num_seqs == max_num_seqs:
        ev["saturated_fraction"] = tel.saturated_fraction
    use = tel.budget_use(max_num_batched_tokens)
    if use is not None:
        ev.update(
            steps=use.steps,
            mean_tokens_per_step=use.mean_tokens,
            budget_utilization=use.utilization,
            near_budget_fraction=use.near_fraction,
            near_budget_min_tokens=use.near_min_tokens,
        )
    queue, e2e = tel.mean_queue_time_s, tel.mean_e2e_s
    if queue is not None and tel.finished >= MIN_FINISHED:
        ev["mean_queue_time_s"] = queue
        if e2e is not None and e2e > 0:
            ev["mean_e2e_s"] = e2e
            ev["queue_share"] = queue / e2e
    return ev


def _queue_level(ev: dict[str, float]) -> Literal["high", "low", "mid"] | None:
    if "mean_queue_time_s" not in ev:
        return None
    if ev["mean_queue_time_s"] <= QUEUE_LOW_S:
        return "low"
    share = ev.get("queue_share")
    if share is None:
        return None
    return "high" if share >= QUEUE_HIGH_SHARE else "low" if share <= QUEUE_LOW_SHARE else "mid"


def diagnose(tel: LevelTelemetry, *, max_num_seqs: int, max_num_batched_tokens: int) -> Diagnosis:
    """The level's bottleneck under engine args ``max_num_seqs`` / ``max_num_batched_tokens``."""
    ev = _evidence(tel, max_num_seqs, max_num_batched_tokens)

    def verdict(kind: Kind, suggestion: str) -> Diagnosis:
        return Diagnosis(kind, ev, suggestion)

    queue = ev.get("mean_queue_time_s", 0.0)
    share = ev.get("queue_share", 0.0)
    waiting = f"requests queue (mean {queue:.3g} s, {share:.0%} of e2e)"
    if ev.get("preemptions", 0.0) > 0:
        return verdict(
            "memory-bound",
            (
                f"{ev['preemptions']:.0f} preemptions: the KV cache is short. Shrink max_num_seqs "
                f"(now {max_num_seqs}) or max_model_len, or raise gpu_memory_utilization."
            ),
        )
    if ev.get("kv_usage_max", 0.0) >= KV_FULL:
        return verdict(
            "memory-bound",
            (
                f"KV cache usage reached {ev['kv_usage_max']:.0%}: it is full. Shrink "
                f"max_num_seqs (now {max_num_seqs}) or max_model_len, or raise "
                "gpu_memory_utilization."
            ),
        )
    level = _queue_level(ev)
    sat = ev.get("saturated_fraction")
    if sat is not None and sat >= SATURATED_MIN and level != "low":
        return verdict(
            "concurrency-capped",
            (
                f"Running sat at max_num_seqs={max_num_seqs} with requests waiting for {sat:.0%} "
                "of the level: raise max_num_seqs."
            ),
        )
    if level is None:
        why = (
            "no before/after snapshot pair"
            if not tel.has_deltas
            else f"fewer than {MIN_FINISHED} requests finished in the level"
        )
        return verdict("inconclusive", f"No queue-time evidence ({why}); rerun the level.")
    if level == "low":
        return verdict(
            "headroom",
            (
                f"Requests barely queue (mean {queue:.3g} s, {share:.0%} of e2e) and nothing was "
                "preempted: the config has room; offer more load."
            ),
        )
    if level == "mid":
        return verdict(
            "inconclusive",
            (
                f"Moderate queueing (mean {queue:.3g} s, {share:.0%} of e2e, between "
                f"{QUEUE_LOW_SHARE:.0%} and {QUEUE_HIGH_SHARE:.0%}): no limit clearly binds."
            ),
        )
    near, util = ev.get("near_budget_fraction"), ev.get("budget_utilization")
    if near is None or util is None:
        return verdict(
            "inconclusive",
            f"{waiting.capitalize()}, but no iteration-tokens "
            "histogram tells whether the token budget binds.",
        )
    if near >= NEAR_BUDGET_MIN:
        return verdict(
            "token-budget-bound",
            (
                f"{near:.0%} of steps run at or near max_num_batched_tokens="
                f"{max_num_batched_tokens} while {waiting}: raise max_num_batched_tokens."
            ),
        )
    running_max = ev.get("running_max")
    if util <= WELL_BELOW_BUDGET and (running_max is None or running_max >= max_num_seqs):
        return verdict(
            "concurrency-capped",
            (
                f"Steps use {util:.0%} of the token budget while {waiting}: admission stops at "
                f"max_num_seqs={max_num_seqs}; raise it."
            ),
        )
    if util <= WELL_BELOW_BUDGET:
        return verdict(
            "inconclusive",
            (
                f"{waiting.capitalize()} with steps at {util:.0%} of the budget, but running never "
                f"reached max_num_seqs={max_num_seqs} (peak {running_max:.0f}): neither knob "
                "binds; "
                "KV space may be blocking admission."
            ),
        )
    return verdict(
        "inconclusive",
        (
            f"{waiting.capitalize()}; steps average {util:.0%} of the budget but only "
            f"{near:.0%} reach it: neither limit clearly binds."
        ),
    )
