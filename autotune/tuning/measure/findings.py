"""What a finished trial found, in the words every reader shows (pure): the request rate at
its capacity, why it is infeasible, a stopped level's figures, and the :class:`TrialSummary`
the controller writes as the trial's attributes before it tells Optuna the result. The
reports (``autotune.report``) print the same facts from these functions, so optuna-dashboard
and ``study show`` never disagree.

A level the early-stop rule ended shows only what it measured (:mod:`autotune.loadgen.stopped`,
docs/tuning.md#10-early-stop-inside-a-level)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import StudyConfig
from autotune.loadgen.client_limit import ClientLimit
from autotune.loadgen.stopped import LATENCIES, RATES, THROUGHPUTS, StopInfo, Stopped
from autotune.loadgen.stopped import stopped_figures as _figures
from autotune.store import LevelRecord, TrialRecord
from autotune.tuning.attrs import TrialSummary
from autotune.tuning.measure.capacity import Lattice, Spread, spread_of
from autotune.tuning.measure.scoring import Slo, binding_slo
from autotune.tuning.search.stages import capacity_bracket, memory_evidence

if TYPE_CHECKING:
    from autotune.tuning.measure.trial import TrialOutcome

__all__ = [
    "capacity_rps",
    "capacity_spread",
    "record_stopped",
    "stop_note",
    "trial_summary",
    "why_infeasible",
]

_FIGURES = (*LATENCIES, *THROUGHPUTS, *RATES)


def record_stopped(lv: LevelRecord | None) -> Stopped | None:
    """A stored level's figures as shown, None unless it stopped early. The rates certain to
    break their limits are the ones its violations give as lower bounds (scored so)."""
    if lv is None:
        return None
    certain = {
        str(v["name"]): float(v["value"])
        for v in lv.violations
        if v.get("bound") and v.get("name") in RATES and v.get("value") is not None
    }
    return _figures(lv.metrics, {k: getattr(lv, k) for k in _FIGURES}, certain)


def stop_note(summary: Mapping[str, Any] | None) -> str:
    """`` (stopped early on p99 TTFT at request 103 of 400)`` for a stopped level, else ""."""
    stop = StopInfo.of(summary)
    return stop.note if stop is not None else ""


def capacity_rps(t: TrialRecord) -> float | None:
    """The request rate offered at the trial's capacity (its headline feasible level)."""
    if not t.feasible:
        return None
    lv = t.headline_level()
    return lv.offered_rate if lv is not None else None


def capacity_spread(t: TrialRecord, lattice: Lattice) -> Spread | None:
    """How sure a finished slo-capacity trial's capacity is, from its stored levels (every
    run of every lattice point; client-limited levels, which no verdict rests on, left out):
    the same :func:`~autotune.tuning.measure.capacity.spread_of` as the search's own result
    (docs/tuning.md#1-the-capacity-lattice, "Noise"). None for an unfinished or failed trial."""
    if t.state != "COMPLETE" or t.failure_class or not t.levels:
        return None
    runs: dict[int, list[bool]] = {}
    for lv in t.levels:
        if ClientLimit.of(lv.metrics) is None:
            runs.setdefault(lattice.index(lv.scale), []).append(bool(lv.feasible))
    cap = t.capacity_scale if t.feasible else None
    return spread_of(lattice, runs, lattice.index(cap) if cap is not None else None)


def why_infeasible(t: TrialRecord, mode: str = "slo-capacity") -> str | None:
    """Why a trial has no feasible load, in words: the worker failure, or each violated
    constraint with its value and limit at the lowest load it tried, e.g. "capacity below
    the lowest load tried (1.00 req/s, x0.250): p99 TTFT 3,412 ms > 2,000 ms"."""
    if t.state != "COMPLETE" or t.feasible:
        return None
    if t.failure_class and not t.levels:
        return f"worker failed: {t.failure_class}"
    low = t.headline_level()
    if low is None:
        return t.failure_class or "no load level measured"
    what = "; ".join(low.violation_texts) or "violates the SLOs"
    what += stop_note(low.metrics)  # a stopped level says why and when
    rate = f"{low.offered_rate:,.2f} req/s, " if low.offered_rate is not None else ""
    if all(v.get("name") == "overlength_rate" for v in low.violations) and low.violations:
        head = "requests too long for max_model_len at any load"
    elif mode == "slo-capacity":
        head = f"capacity below the lowest load tried ({rate}x{low.scale:.3f})"
    else:
        head = f"infeasible at the workload's {'rate' if rate else 'concurrency'}" + (
            f" ({rate.rstrip(', ')})" if rate else ""
        )
    if t.failure_class:
        head += f", then the worker failed ({t.failure_class})"
    return f"{head}: {what}"


def _r(v: float | None, digits: int) -> float | None:
    return round(v, digits) if v is not None else None


def _spread_attrs(sp: Spread | None) -> dict[str, Any]:
    """The capacity's spread as :class:`TrialSummary` fields
    (docs/tuning.md#1-the-capacity-lattice, "Noise")."""
    if sp is None:
        return {}
    return {
        "capacity_held": sp.at.text() if sp.at is not None else None,
        "capacity_above_held": sp.above.text() if sp.above is not None else None,
        "capacity_band_low": _r(sp.band_low, 4),
        "capacity_band_high": _r(sp.band_high, 4),
        "capacity_monotone": sp.monotone,
    }


def trial_summary(out: TrialOutcome, cfg: StudyConfig) -> TrialSummary:
    """The attributes of a finished trial: its verdict, the headline figures (a stopped
    level's only as far as it measured them) and what the staged plan reads from the
    baseline (docs/tuning.md#8-the-staged-plan)."""
    rec, score = out.record, out.score
    top = rec.headline_level()
    p99_ttft = _r(top.p99_ttft_ms, 1) if top is not None else None
    p99_tpot = _r(top.p99_tpot_ms, 2) if top is not None else None
    stopped = None
    if (s := record_stopped(top)) is not None:  # a stopped level: only what it measured
        p99_ttft, p99_tpot = _r(s.values["p99_ttft_ms"], 2), _r(s.values["p99_tpot_ms"], 2)
        stopped = s.stop.text
    diag = rec.diagnosis or {}
    mem = memory_evidence(lv.diagnosis for lv in capacity_bracket(rec.levels))
    feasible_top = score.feasible and top is not None
    settled = rec.settled_below is not None  # bounded: neither feasible nor infeasible
    return TrialSummary(
        feasible=None if settled else score.feasible,
        failure_class=out.failure_class,
        capacity_scale=round(score.capacity_scale, 4) if score.capacity_scale else None,
        capacity_req_s=_r(capacity_rps(rec), 3),
        capacity_status=score.capacity.status if score.capacity is not None else None,
        **_spread_attrs(score.capacity.spread if score.capacity is not None else None),
        p99_ttft_ms=p99_ttft,
        p99_tpot_ms=p99_tpot,
        kv_cache_tokens=rec.kv_cache_tokens,
        settled_below=_r(rec.settled_below, 4),
        settled_against=rec.settled_against,
        why_infeasible=None if settled else why_infeasible(rec, cfg.mode),
        launch_command=rec.launch_command,
        stopped=stopped,
        diagnosis=diag.get("kind"),
        diagnosis_suggestion=diag.get("suggestion"),
        levels=mem.levels,
        kv_usage_peak=_r(mem.kv_peak, 4),
        preemptions=mem.preemptions,
        binding_slo=(
            binding_slo(top.p99_ttft_ms, top.p99_tpot_ms, Slo.of(cfg.slo))
            if feasible_top and top is not None
            else None
        ),
    )
