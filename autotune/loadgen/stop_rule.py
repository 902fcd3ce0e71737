"""Early stop inside a level: end a replay as soon as its verdict is certain
(docs/tuning.md#10-early-stop-inside-a-level).

Pure counting, no I/O. A replay feeds a :class:`Tally` with what it knows so far; the
:class:`StopRule` says whether the level is already certain to break a latency SLO or the
error limit, whatever the requests still to come do. The load generator and the in-process
simulator both use it, and both end a stopped level the same way (:func:`stopped_summary`).

The latency bound: ``np.percentile(x, 99)`` over ``n`` values interpolates between the order
statistics at ``floor(0.99 (n - 1))`` and the one above, so it exceeds a limit whatever the
other values are once ``k >= n - floor(0.99 (n - 1)) = ceil(0.01 (n - 1)) + 1`` values do.
The bound grows with ``n``, so it holds for the final set of successes when it holds for
``n_max``, the planned requests minus the failures so far.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from autotune.config import SloConfig
from autotune.loadgen.stopped import StopInfo

__all__ = ["StopRule", "Tally", "needed", "stopped_summary"]


def needed(n_max: int) -> int:
    """Values above a limit that put the linear-interpolation p99 of ``n_max`` values above
    it, whatever the others are: ``ceil(0.01 (n_max - 1)) + 1`` (in integers)."""
    return -(-(max(n_max, 1) - 1) // 100) + 1


@dataclass(frozen=True)
class StopRule:
    """The limits a level is judged by (ms; rates as fractions). ``None``: no such SLO.

    The one record of a study's four SLO fields: tuning's verdicts judge a level by the same
    record (:class:`autotune.tuning.measure.scoring.Slo`), which lives here because the load
    generator cannot import tuning (docs/architecture.md)."""

    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    max_error_rate: float = 0.0
    max_overlength_rate: float = 0.01

    @classmethod
    def of(cls, s: SloConfig) -> Self:
        """The SLOs a study config states."""
        return cls(s.p99_ttft_ms, s.p99_tpot_ms, s.max_error_rate, s.max_overlength_rate)

    def widened(self, factor: float) -> Self:
        """The same rule with its latency limits times ``factor``: a level it stops breaks
        them by more than ``factor - 1`` (a settle point's first run,
        docs/tuning.md#14-settling-losing-trials, "Near misses")"""
        ttft, tpot = self.p99_ttft_ms, self.p99_tpot_ms
        return dataclasses.replace(
            self,
            p99_ttft_ms=ttft * factor if ttft is not None else None,
            p99_tpot_ms=tpot * factor if tpot is not None else None,
        )

    def exceeds_ttft(self, seconds: float) -> bool:
        # the same float operations as the summary's: seconds * 1000, then a strict >
        return self.p99_ttft_ms is not None and seconds * 1000.0 > self.p99_ttft_ms

    def exceeds_tpot(self, seconds: float) -> bool:
        return self.p99_tpot_ms is not None and seconds * 1000.0 > self.p99_tpot_ms

    def verdict(self, t: Tally) -> str | None:
        """Why the level is already certain to be infeasible (``error_rate``, ``p99_ttft``,
        ``p99_tpot``), or None while it is not."""
        if t.planned <= 0:
            return None
        if t.errors / t.planned > self.max_error_rate:  # errors only grow; total = planned
            return "error_rate"
        need = needed(t.planned - t.failed)
        # requests counted by TTFT that have not finished could still fail; a level that
        # can take that many more failures within its limits needs as many more over the SLO
        if t.ttft_over - min(t.ttft_pending, self._failures_left(t)) >= need:
            return "p99_ttft"
        if t.tpot_over >= need:  # finished requests only: a TPOT is known at the end
            return "p99_tpot"
        return None

    def _failures_left(self, t: Tally) -> int:
        """More failures the level could take with both rates still within their limits
        (rounded up: erring high only makes the rule more careful)."""
        err = int(self.max_error_rate * t.planned) + 1 - t.errors
        ovl = int(self.max_overlength_rate * t.planned) + 1 - t.over_length
        return max(err, 0) + max(ovl, 0)


@dataclass
class Tally:
    """What a replay knows so far (measured requests only).

    ``ttft_over``: requests whose TTFT is known to exceed the SLO, finished or not, counting
    a request with no first token yet whose age already exceeds it; ``ttft_pending``: how
    many of those are still in flight and might yet fail (0 on the simulator, where a queued
    request cannot fail). ``tpot_over``: finished successes whose TPOT exceeds the SLO.
    ``over_length``: over-length rejections plus truncated successes.
    """

    planned: int
    failed: int = 0
    errors: int = 0
    over_length: int = 0
    ttft_over: int = 0
    ttft_pending: int = 0
    tpot_over: int = 0


def stopped_summary(
    summary: Mapping[str, Any],
    *,
    reason: str,
    at_request: int,
    planned: int,
    replay_s: float,
    ttft_known_s: Sequence[float],
    saved_s_at_least: float,
    tpot_known_s: Sequence[float] = (),
    failed: int = 0,
) -> tuple[dict[str, Any], StopInfo]:
    """A stopped level's summary (the one over its finished requests, still only bench keys)
    and the :class:`~autotune.loadgen.stopped.StopInfo` recording why and when. A TTFT stop
    also takes ``p99_ttft_ms`` over every request whose TTFT is known or bounded
    (``ttft_known_s``: finished successes' TTFTs, unfinished requests' known TTFT or their
    age at the stop, a lower bound), so the level reads as
    infeasible for the reason it stopped (by the bound, that p99 exceeds the SLO); a TPOT stop
    counted with unfinished requests' TPOT bounds does the same with ``tpot_known_s``, and
    the stop's ``bound`` names that latency (``ttft``, ``tpot``; None when no figure was
    restated): its mean, median and percentiles are all over those requests, so each is a
    lower bound. Its other figures cover the finished requests only (what they say of the
    level: :mod:`autotune.loadgen.stopped`).

    Those figures are over ``planned - failed`` values, the requests not yet known (not sent,
    or with no bound) at 0: each value known is a lower bound of its request's, and a
    percentile over more values lies lower, so each figure is a lower bound of the one the
    full level would have printed. A percentile over the known values alone is not: at the
    stop a tail is over-represented among them. The stop rule's count (:func:`needed`) still
    puts that p99 above the SLO."""
    out = dict(summary)
    known = {"p99_ttft": ttft_known_s, "p99_tpot": tpot_known_s}.get(reason)
    bound = None
    if known:
        ms = np.zeros(max(planned - failed, len(known)))
        ms[: len(known)] = np.asarray(known) * 1000.0
        out[f"{reason}_ms"] = float(np.percentile(ms, 99))
        bound = reason.removeprefix("p99_")
        _restate(out, bound, ms)
    stop = StopInfo(reason, at_request, planned, bound, replay_s, max(saved_s_at_least, 0.0))
    return out, stop


def _restate(out: dict[str, Any], name: str, ms: np.ndarray[Any, Any]) -> None:
    """The mean, median and percentiles of ``name`` over the same requests as its p99 (every
    request sent, the unfinished ones at a lower bound), so none of them is read against a
    p99 over other requests: a p99.9 over the finished ones alone can lie below that p99.
    ``std`` is no bound and stays over the finished requests."""
    tail = f"_{name}_ms"
    for key in [k for k in out if k.endswith(tail)]:
        stat = key[: -len(tail)]
        if stat == "mean":
            out[key] = float(np.mean(ms))
        elif stat == "median":
            out[key] = float(np.median(ms))
        elif stat != "p99" and stat.startswith("p"):
            try:
                out[key] = float(np.percentile(ms, float(stat[1:])))
            except ValueError:
                continue  # not a percentile key
