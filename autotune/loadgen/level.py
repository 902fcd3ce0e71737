"""One load level's figures as one typed record, and the one definition of its rates.

The load generator's summary (``vllm bench serve``'s keys, :func:`.bench_stats.summarize`)
and the in-process simulator both become a :class:`LevelMetrics`; scoring reads it, storage
writes its fields as columns (:func:`autotune.tuning.measure.outcome.level_record`). The rates are
defined here and nowhere else (docs/tuning.md#3-the-per-level-record):

- ``error_rate``: requests that failed for any reason other than ``max_model_len``
  (HTTP errors, timeouts, stalls, cancellations), over every measured request;
- ``overlength_rate``: requests ``max_model_len`` did not fit (refused with a 400 because the
  prompt alone reaches it, or served cut short), over every measured request.

A request counts in at most one of the two. Warm-up requests count in neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.loadgen.client_limit import ClientLimit, check
from autotune.loadgen.stopped import StopInfo
from autotune.loadgen.verdict_point import VerdictAt

__all__ = ["LevelMetrics", "error_rate", "overlength_rate"]


def error_rate(failed: int, over_length: int, total: int) -> float:
    """Failed requests that were not over-length rejections, over all measured requests
    (0 when nothing was measured)."""
    return (failed - over_length) / total if total > 0 else 0.0


def overlength_rate(over_length: int, truncated: int, total: int) -> float:
    """Over-length rejections plus truncated responses, over all measured requests."""
    return (over_length + truncated) / total if total > 0 else 0.0


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    x = float(v)
    return None if x != x else x  # NaN: nothing measured


@dataclass(frozen=True)
class LevelMetrics:
    """What one replay at one load produced. Latencies in ms, rates per second.

    ``failed`` counts every measured request that did not succeed, over-length rejections
    included; ``over_length`` is the part of it refused for length, ``truncated`` the
    successful requests cut short by ``max_model_len``. ``summary`` keeps the full
    ``vllm bench serve``-style result the record was read from (exports show it), and only
    that: autotune's own facts of the level are typed fields.

    ``stop`` is the early stop that ended the level (None: it ran to its end,
    docs/tuning.md#10-early-stop-inside-a-level). It lives here rather than on the runner's
    level outcome because scoring and the live progress line read it from the metrics alone,
    before any outcome exists; the outcome reads it from here.

    ``observed`` is where the early-stop rule, watching a level it did not stop, found it
    certain to be infeasible (None: it did not, or nothing watched); :attr:`verdict` is that
    point or the stop's, what the sampler is told of an infeasible level
    (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees").

    ``client_limit`` says the client could not drive the level (None: it could, or no client
    sent it, as in the in-process simulator): its figures are then the client's and no
    verdict rests on them (docs/loadgen.md#5-client-limited-levels). :meth:`from_summary`
    reads it from the summary's figures, so every runner with a client gets it.
    """

    completed: int
    failed: int
    over_length: int = 0
    truncated: int = 0
    duration_s: float = 0.0
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    output_throughput: float = 0.0
    request_throughput: float = 0.0
    goodput: float | None = None
    num_preemptions: float | None = None
    # the worker died during the level: sending stopped, what was measured is kept (never
    # feasible; docs/vllm.md#9-worker-death); the runner's level outcome holds the death
    partial: bool = False
    stop: StopInfo | None = None
    client_limit: ClientLimit | None = None
    observed: VerdictAt | None = None
    summary: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if min(self.completed, self.failed, self.over_length, self.truncated) < 0:
            raise ValueError("request counts must be >= 0")
        if self.over_length > self.failed:
            raise ValueError("over-length rejections are failed requests: over_length > failed")
        if self.truncated > self.completed:
            raise ValueError("truncated requests are completed ones: truncated > completed")

    @property
    def verdict(self) -> VerdictAt | None:
        """When the level's infeasible verdict became certain: the stop's point, else the
        observed one (None: neither)."""
        s = self.stop
        if s is not None:
            return VerdictAt(s.reason, s.at_request, s.planned)
        return self.observed

    @property
    def total(self) -> int:
        """Measured requests (warm-ups excluded)."""
        return self.completed + self.failed

    @property
    def errors(self) -> int:
        return self.failed - self.over_length

    @property
    def error_rate(self) -> float:
        return error_rate(self.failed, self.over_length, self.total)

    @property
    def overlength_rate(self) -> float:
        return overlength_rate(self.over_length, self.truncated, self.total)

    @classmethod
    def from_summary(
        cls,
        s: Mapping[str, Any],
        stop: StopInfo | None = None,
        observed: VerdictAt | None = None,
    ) -> LevelMetrics:
        """Read :func:`autotune.loadgen.bench_stats.summarize`'s result (vLLM's key names), of a
        level that ``stop`` ended (None: it ran to its end; ``observed``: where the watching
        rule found it infeasible), with its client-limit check."""
        pre = s.get("num_preemptions")
        return cls(
            completed=int(s.get("completed") or 0),
            failed=int(s.get("failed") or 0),
            over_length=int(s.get("over_length_rejections") or 0),
            truncated=int(s.get("truncated_requests") or 0),
            duration_s=float(s.get("duration") or 0.0),
            p99_ttft_ms=_opt_float(s.get("p99_ttft_ms")),
            p99_tpot_ms=_opt_float(s.get("p99_tpot_ms")),
            p99_itl_ms=_opt_float(s.get("p99_itl_ms")),
            output_throughput=float(s.get("output_throughput") or 0.0),
            request_throughput=float(s.get("request_throughput") or 0.0),
            goodput=_opt_float(s.get("request_goodput")),
            num_preemptions=_opt_float(pre),
            stop=stop,
            client_limit=check(s),
            observed=observed if stop is None else None,
            summary=dict(s),
        )

    def with_preemptions(self, n: float) -> LevelMetrics:
        """The same record with the server's preemption count over the level."""
        return LevelMetrics(
            **{k: getattr(self, k) for k in _FIELDS if k not in ("num_preemptions", "summary")},
            num_preemptions=float(n),
            summary={**self.summary, "num_preemptions": n},
        )

    def to_dict(self) -> dict[str, Any]:
        """The full summary with the typed figures and both rates on top (what exports show;
        the store's ``metrics`` column adds the level's stored facts to it,
        :func:`autotune.tuning.measure.outcome.level_record`)."""
        out = dict(self.summary)
        out.update(
            completed=self.completed,
            failed=self.failed,
            over_length_rejections=self.over_length,
            truncated_requests=self.truncated,
            error_rate=self.error_rate,
            overlength_rate=self.overlength_rate,
        )
        if self.num_preemptions is not None:
            out["num_preemptions"] = self.num_preemptions
        return out


_FIELDS = tuple(LevelMetrics.__dataclass_fields__)
