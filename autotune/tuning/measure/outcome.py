"""One replayed load level as the runners hand it to the trial, and its stored form.

A runner returns a :class:`LevelOutcome`: the level's typed metrics, the server's telemetry
and the bottleneck read from it (docs/method.md#3-reading-the-bottleneck), and, when the
worker died under load, a :class:`LevelDeath` (docs/vllm.md#9-worker-death). This module is
the one place that turns them into the stored :class:`~autotune.store.LevelRecord`
(:func:`level_record`), and it owns the stored keys of the replayed seconds
(:func:`replay_seconds`) and of the death (:meth:`LevelDeath.stored_metrics`); the early stop's
key is :class:`~autotune.loadgen.stopped.StopInfo`'s, the client-limit mark's
:class:`~autotune.loadgen.client_limit.ClientLimit`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.loadgen.bench_stats import RequestRecord
from autotune.loadgen.level import LevelMetrics
from autotune.loadgen.stopped import StopInfo
from autotune.store import LevelRecord
from autotune.telemetry.diagnosis import Diagnosis
from autotune.telemetry.summary import LevelTelemetry
from autotune.tuning.measure.scoring import LevelScore
from autotune.workers.watch import DeathReport
from autotune.workload.sustain import looped_stored

__all__ = ["EnginePeaks", "LevelDeath", "LevelOutcome", "level_record", "replay_seconds"]

_REPLAY_S = "replay_s"  # seconds replayed, in a stored level's metrics


def replay_seconds(metrics: Mapping[str, Any]) -> float:
    """The seconds a stored level replayed (its ``metrics``; 0 when not recorded)."""
    return float(metrics.get(_REPLAY_S, 0.0))


@dataclass(frozen=True)
class LevelDeath:
    """A level the worker's death cut short: what is known of the death (None when the
    worker could not say) and how far the level got. Times are the records' engine seconds
    from the replay's start; ``last_sent_at_s`` None when nothing measured was sent."""

    report: DeathReport | None
    detected_at_s: float | None
    stopped_at_s: float | None
    planned_requests: int
    sent_requests: int
    last_sent_at_s: float | None

    @property
    def log_context(self) -> str:
        return self.report.log_context if self.report is not None else ""

    def stored(self) -> dict[str, Any]:
        """What a level's stored metrics keep of the death (the log context goes to the
        trial's log tail)."""
        r = self.report
        d = r.death if r is not None else None
        return {
            "cause": d.cause if d is not None else None,
            "message": d.message if d is not None else None,
            "pid": d.pid if d is not None else None,
            "process": d.process if d is not None else None,
            "returncode": d.returncode if d is not None else None,
            "signal": d.signal if d is not None else None,
            "failure_class": r.failure_class if r is not None else None,
            "log_line": r.log_line if r is not None else None,
            "detected_at_s": self.detected_at_s,
            "detected_wall": d.detected_wall if d is not None else None,
            "stopped_at_s": self.stopped_at_s,
        }

    def stored_metrics(self) -> dict[str, Any]:
        """The keys a cut-short level's stored metrics add: ``partial``, how far the level
        got and the death (:meth:`stored`)."""
        return {
            "partial": True,
            "planned_requests": self.planned_requests,
            "sent_requests": self.sent_requests,
            "last_sent_at_s": self.last_sent_at_s,
            "worker_death": self.stored(),
        }


@dataclass(frozen=True)
class EnginePeaks:
    """What a level asked of the engine at its busiest, the facts that say whether a limit
    bound (docs/tuning.md#14-settling-losing-trials, "A limit the engine never reached"):
    ``running``, the most requests that can have run at once, known for certain (the
    in-process simulator counts every step; over HTTP, the client's most requests in flight
    over a level that ran to its end, warm-ups included, which the engine's count cannot
    exceed; a stopped level's peaks are None there, its cut requests not being recorded);
    ``kv_usage``, the highest KV cache usage seen (0..1; scraped gauges sample it; None: not
    known); ``preemptions`` during the level (None: not known)."""

    running: int
    kv_usage: float | None
    preemptions: int | None


@dataclass
class LevelOutcome:
    """One level a runner replayed: its load (``scale`` times the workload's rate, the
    offered requests per second when the workload has arrival times), its metrics, the
    server's telemetry and the diagnosis read from it (None when none was scraped), the
    worker's death when it died during the level, and the seconds replayed (warm-ups
    excluded; wall seconds over HTTP, engine seconds in the simulator; None when not
    measured). The early stop is the metrics' (:attr:`stop`)."""

    scale: float
    offered_rate: float | None
    metrics: LevelMetrics
    telemetry: LevelTelemetry | None = None
    diagnosis: Diagnosis | None = None
    death: LevelDeath | None = None
    replay_s: float | None = None
    # the sample's requests when the level looped it (docs/tuning.md#13-level-length); None:
    # the level replayed the sample as it is
    sample_requests: int | None = None
    # the measured requests' records, held until the trial stores the level (and them when
    # the study keeps them, docs/loadgen.md#6-per-request-records)
    requests: Sequence[RequestRecord] = ()
    # the engine at its busiest (None: not known)
    peaks: EnginePeaks | None = None

    @property
    def stop(self) -> StopInfo | None:
        """The early stop that ended the level (None: it ran to its end); the metrics own it,
        scoring reads it there."""
        return self.metrics.stop


def level_record(i: int, out: LevelOutcome, ls: LevelScore) -> LevelRecord:
    """The stored form of one level: the typed metrics' fields as columns, the violations in
    words, and as the ``metrics`` JSON the full summary with the replayed seconds, the early
    stop, the client-limit mark and the worker's death, each in the shape its owner reads
    back."""
    m = out.metrics
    stored = m.to_dict()
    if out.replay_s is not None:
        stored[_REPLAY_S] = out.replay_s
    if m.stop is not None:
        stored.update(m.stop.stored())
    if m.observed is not None:
        stored.update(m.observed.stored())
    if m.client_limit is not None:
        stored.update(m.client_limit.stored())
    if out.death is not None:
        stored.update(out.death.stored_metrics())
    if out.sample_requests is not None:
        stored.update(looped_stored(out.sample_requests))
    return LevelRecord(
        level_index=i,
        scale=out.scale,
        offered_rate=out.offered_rate,
        achieved_rate=m.request_throughput,
        completed=m.completed,
        failed=m.failed,
        over_length=m.over_length,
        truncated=m.truncated,
        error_rate=m.error_rate,
        overlength_rate=m.overlength_rate,
        p99_ttft_ms=m.p99_ttft_ms,
        p99_tpot_ms=m.p99_tpot_ms,
        p99_itl_ms=m.p99_itl_ms,
        output_throughput=m.output_throughput,
        request_throughput=m.request_throughput,
        goodput=m.goodput,
        feasible=ls.feasible,
        violations=[v.to_dict() for v in ls.broken],
        metrics=stored,
        telemetry=out.telemetry.to_dict() if out.telemetry is not None else None,
        diagnosis=out.diagnosis.to_dict() if out.diagnosis is not None else None,
    )
