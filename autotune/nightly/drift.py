"""Drift detection (pure; docs/nightly.md#3-drift): today's traffic profile against the one
behind the current recommendation.

A :class:`TrafficProfile` keeps what drift is judged on: prompt and output length
percentiles, the mean request rate, and the quantile function of prompt+output lengths at
fixed points, from which the share of requests over any ``max_model_len`` is read (linear
interpolation between the points; beyond p99 the points are p99.5, p99.9 and the maximum).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from autotune.nightly.job_config import DriftConfig

__all__ = [
    "QUANTILE_POINTS",
    "Drift",
    "TrafficProfile",
    "detect_drift",
    "traffic_profile",
]

QUANTILE_POINTS: tuple[float, ...] = (*(float(q) for q in range(100)), 99.5, 99.9, 100.0)
_LENGTH_FIGURES = (
    ("prompt_p50", "prompt", "p50"),
    ("prompt_p90", "prompt", "p90"),
    ("prompt_p99", "prompt", "p99"),
    ("output_p50", "output", "p50"),
    ("output_p90", "output", "p90"),
)


@dataclass(frozen=True)
class TrafficProfile:
    requests: int
    rate: float | None  # mean requests/s (None: no arrival times)
    prompt: Mapping[str, float]  # p50, p90, p99, max
    output: Mapping[str, float]
    total_quantiles: tuple[float, ...]  # prompt+output at QUANTILE_POINTS
    source: str = ""
    approximate_tail: bool = False  # fitted from bucketed histograms (Prometheus)

    def share_over(self, length: int) -> float:
        """The share of requests whose prompt+output exceeds ``length`` tokens."""
        q = np.asarray(self.total_quantiles, dtype=float)
        if length >= q[-1]:
            return 0.0
        if length < q[0]:
            return 1.0
        # the largest percentile whose quantile is <= length (plateaus: the far end)
        pts = np.asarray(QUANTILE_POINTS, dtype=float)
        idx = int(np.searchsorted(q, length, side="right")) - 1
        lo_q, hi_q = q[idx], q[min(idx + 1, len(q) - 1)]
        lo_p, hi_p = pts[idx], pts[min(idx + 1, len(q) - 1)]
        p = lo_p if hi_q <= lo_q else lo_p + (hi_p - lo_p) * (length - lo_q) / (hi_q - lo_q)
        return float(max(0.0, 1.0 - p / 100.0))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_quantiles"] = list(self.total_quantiles)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrafficProfile:
        return cls(
            requests=int(d["requests"]),
            rate=None if d.get("rate") is None else float(d["rate"]),
            prompt={k: float(v) for k, v in d["prompt"].items()},
            output={k: float(v) for k, v in d["output"].items()},
            total_quantiles=tuple(float(x) for x in d["total_quantiles"]),
            source=str(d.get("source", "")),
            approximate_tail=bool(d.get("approximate_tail", False)),
        )


def _stats(values: npt.NDArray[np.float64]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


def traffic_profile(
    prompt: Sequence[float] | npt.NDArray[Any],
    output: Sequence[float] | npt.NDArray[Any],
    rate: float | None,
    *,
    source: str = "",
    approximate_tail: bool = False,
) -> TrafficProfile:
    """The profile of per-request prompt and output lengths (same order) and a rate."""
    p = np.asarray(prompt, dtype=float)
    o = np.asarray(output, dtype=float)
    if p.size == 0 or p.size != o.size:
        raise ValueError("need one prompt and one output length per request (and at least one)")
    total = np.percentile(p + o, QUANTILE_POINTS)
    return TrafficProfile(
        requests=int(p.size),
        rate=rate,
        prompt=_stats(p),
        output=_stats(o),
        total_quantiles=tuple(float(x) for x in np.maximum.accumulate(total)),
        source=source,
        approximate_tail=approximate_tail,
    )


@dataclass(frozen=True)
class Drift:
    drifted: bool
    first_run: bool
    reasons: tuple[str, ...]
    figures: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    share_over: Mapping[int, Mapping[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "drifted": self.drifted,
            "first_run": self.first_run,
            "reasons": list(self.reasons),
            "figures": {k: dict(v) for k, v in self.figures.items()},
            "share_over": {str(k): dict(v) for k, v in self.share_over.items()},
        }

    def summary(self) -> str:
        if self.first_run:
            return "first run (no earlier profile)"
        return "; ".join(self.reasons) if self.drifted else "no drift"


def _change_pct(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or not old > 0 or not math.isfinite(new):
        return None
    return 100.0 * (new / old - 1.0)


def detect_drift(
    old: TrafficProfile | None,
    new: TrafficProfile,
    candidates: Sequence[int],
    thresholds: DriftConfig,
) -> Drift:
    """Compare ``new`` with ``old``: each length percentile and the rate by relative change,
    the share over each ``max_model_len`` candidate by percentage points. Without ``old``
    (the first run) the figures are today's and nothing has drifted."""
    shares_new = {int(c): new.share_over(int(c)) for c in sorted(set(candidates))}
    if old is None:
        today: dict[str, Mapping[str, float | None]] = {
            name: {"new": (new.prompt if part == "prompt" else new.output)[key]}
            for name, part, key in _LENGTH_FIGURES
        }
        today["rate"] = {"new": new.rate}
        return Drift(False, True, (), today, {c: {"new": s} for c, s in shares_new.items()})
    reasons: list[str] = []
    figures: dict[str, dict[str, float | None]] = {}
    for name, part, key in _LENGTH_FIGURES:
        o = (old.prompt if part == "prompt" else old.output)[key]
        n = (new.prompt if part == "prompt" else new.output)[key]
        ch = _change_pct(o, n)
        figures[name] = {"old": o, "new": n, "change_pct": ch}
        if ch is not None and abs(ch) > thresholds.length_pct:
            reasons.append(f"{name} {o:.0f} -> {n:.0f} ({ch:+.1f} %)")
    ch = _change_pct(old.rate, new.rate)
    figures["rate"] = {"old": old.rate, "new": new.rate, "change_pct": ch}
    if ch is not None and abs(ch) > thresholds.rate_pct:
        reasons.append(f"rate {old.rate:.2f} -> {new.rate:.2f} req/s ({ch:+.1f} %)")
    shares: dict[int, dict[str, float]] = {}
    for c, s in shares_new.items():
        o_s = old.share_over(c)
        pp = 100.0 * (s - o_s)
        shares[c] = {"old": o_s, "new": s, "change_pp": pp}
        if abs(pp) > thresholds.share_over_pp:
            reasons.append(f"share over max_model_len {c}: {100 * o_s:.1f} % -> {100 * s:.1f} %")
    return Drift(bool(reasons), False, tuple(reasons), figures, shares)
