"""Promote or keep (pure; docs/nightly.md#5-promote-or-keep).

The dated study's baseline is the incumbent, so its validation summary holds each
challenger's paired gain interval over the incumbent. A challenger is promoted only when
the lower bound of that interval exceeds ``min_gain_pct`` and it held every SLO in every
repeat (the over-length limit pooled over its repeats, as validation judges it). One
exception: an incumbent that broke an SLO or the over-length limit on today's traffic is
replaced by the best validated feasible challenger ("incumbent infeasible"), whatever the
gain; when no challenger is feasible either, the decision says so. When the challengers'
gains lie inside the server's noise band (the validation's "too-noisy" verdict,
docs/tuning.md#7-validation), nothing is promoted and the decision is "too-noisy", not "keep":
the incumbent stays deployed, but the study could not tell the configs apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from autotune.store import TrialRecord
from autotune.tuning.measure.interval import Interval, ValidationSummary, candidate_rank
from autotune.tuning.measure.verdict import held_text

__all__ = ["EXIT_KEEP", "EXIT_NONE_FEASIBLE", "EXIT_PROMOTED", "Decision", "DecisionKind", "decide"]

DecisionKind = Literal["keep", "promote", "none-feasible", "too-noisy"]
EXIT_KEEP, EXIT_PROMOTED, EXIT_NONE_FEASIBLE = 0, 3, 4


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    reason: str
    challenger: TrialRecord | None  # the best validated challenger (promoted or not)
    interval: Interval | None  # its paired gain over the incumbent, percent
    incumbent_feasible: bool

    @property
    def exit_code(self) -> int:
        # too noisy to tell: nothing changes, as for "keep"
        codes = {"keep": EXIT_KEEP, "too-noisy": EXIT_KEEP, "promote": EXIT_PROMOTED}
        return codes.get(self.kind, EXIT_NONE_FEASIBLE)


def _iv(iv: Interval) -> str:
    return f"{iv.mean:+.1f} % ({100 * iv.confidence:.0f} % CI {iv.low:+.1f} … {iv.high:+.1f} %)"


def _why_incumbent_failed(s: ValidationSummary) -> str:
    parts = []
    h = s.baseline
    if h.all_held < h.all_runs:
        parts.append(f"its SLOs held {held_text(h)}")
    if not s.baseline_overlength_ok and s.baseline_overlength_rate is not None:
        parts.append(
            f"it cut {100 * s.baseline_overlength_rate:.1f} % of requests over its "
            f"max_model_len (the limit is {100 * s.max_overlength_rate:g} %)"
        )
    return "; ".join(parts)


def decide(
    summary: ValidationSummary | None,
    trials: Sequence[TrialRecord],
    min_gain_pct: float,
) -> Decision:
    """The decision from the dated study's validation summary and trials."""
    by_number = {t.optuna_trial_number: t for t in trials}
    base = next((t for t in trials if t.stage == "baseline" and t.state == "COMPLETE"), None)
    if summary is None or not summary.complete:
        # nothing was validated: no feasible challenger to compare (or the time ran out)
        feasible = base is not None and bool(base.feasible)
        if feasible:
            return Decision("keep", "no feasible challenger was validated", None, None, True)
        return Decision(
            "none-feasible",
            "incumbent infeasible on today's traffic, and no challenger is feasible",
            None,
            None,
            False,
        )
    eligible = sorted(
        (c for c in summary.candidates if c.eligible), key=candidate_rank, reverse=True
    )
    # its run in the study counts as one of its runs (docs/tuning.md#7-validation)
    inc_ok = summary.baseline_ok
    if not inc_ok:
        why = _why_incumbent_failed(summary)
        if not eligible:
            return Decision(
                "none-feasible",
                f"incumbent infeasible ({why}), and no challenger held every SLO in every repeat",
                None,
                None,
                False,
            )
        top = eligible[0]
        if top.interval is None:
            top = max(eligible, key=lambda c: c.mean_figure or 0.0)
        return Decision(
            "promote",
            f"incumbent infeasible ({why}); trial {top.trial_number} held every SLO in every "
            "repeat",
            by_number.get(top.trial_number),
            top.interval,
            False,
        )
    if not eligible:
        return Decision("keep", "no challenger held every SLO in every repeat", None, None, True)
    top = eligible[0]
    iv = top.interval
    cand = by_number.get(top.trial_number)
    band = summary.noise_band_pct
    if summary.verdict == "too-noisy" or (
        band is not None and iv is not None and iv.low > min_gain_pct and iv.mean <= band
    ):
        # the gain is inside the server's noise band: no promotion, and no "keep" either
        return Decision("too-noisy", summary.reason or "too noisy to tell", cand, iv, True)
    if iv is not None and iv.low > min_gain_pct:
        return Decision(
            "promote",
            f"trial {top.trial_number}: gain {_iv(iv)} over the incumbent; the lower bound "
            f"exceeds min_gain_pct {min_gain_pct:g} % and every SLO held in every repeat",
            cand,
            iv,
            True,
        )
    what = _iv(iv) if iv is not None else "unknown (no paired runs)"
    return Decision(
        "keep",
        f"within noise: the best challenger (trial {top.trial_number}) gains {what}; the "
        f"lower bound does not exceed min_gain_pct {min_gain_pct:g} %",
        cand,
        iv,
        True,
    )
