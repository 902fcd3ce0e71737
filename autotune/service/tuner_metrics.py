"""The tuner's own metrics for ``/metrics``: trials run and failed by class, each
deployment's last decision and its time, and its drift figures; read from the database at
each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from autotune.store import Store
from autotune.store.rows import NightlyDecisionRow, TrialRow

__all__ = ["metrics_text"]

_DECISIONS = ("keep", "promote", "none-feasible", "too-noisy", "rollback")


class _TunerCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        with self.store._session("reading metrics") as s:
            by_state = s.execute(
                select(TrialRow.state, func.count()).group_by(TrialRow.state)
            ).all()
            failed = s.execute(
                select(TrialRow.failure_class, func.count())
                .where(TrialRow.failure_class.is_not(None))
                .group_by(TrialRow.failure_class)
            ).all()
            last_ids = select(func.max(NightlyDecisionRow.id)).group_by(
                NightlyDecisionRow.deployment
            )
            last = s.scalars(
                select(NightlyDecisionRow).where(NightlyDecisionRow.id.in_(last_ids))
            ).all()
            rows = [(d.deployment, d.decision, d.created_at, d.drift or {}) for d in last]
        trials = GaugeMetricFamily("autotune_trials", "trials stored, by state", labels=["state"])
        for state, n in by_state:
            trials.add_metric([str(state)], float(n))
        yield trials
        fails = GaugeMetricFamily(
            "autotune_trials_failed",
            "trials whose worker failed, by failure class",
            labels=["failure_class"],
        )
        for fc, n in failed:
            fails.add_metric([str(fc)], float(n))
        yield fails
        decision = GaugeMetricFamily(
            "autotune_last_decision",
            "1 for the last nightly decision of each deployment",
            labels=["deployment", "decision"],
        )
        when = GaugeMetricFamily(
            "autotune_last_decision_timestamp_seconds",
            "when it was made",
            labels=["deployment"],
        )
        drifted = GaugeMetricFamily(
            "autotune_drifted", "1 if the last run found drift", labels=["deployment"]
        )
        drift = GaugeMetricFamily(
            "autotune_drift_change_pct",
            "the last run's drift figures (relative change)",
            labels=["deployment", "figure"],
        )
        for dep, kind, at, dr in rows:
            for k in _DECISIONS:
                decision.add_metric([dep, k], 1.0 if k == kind else 0.0)
            when.add_metric([dep], at.timestamp())
            drifted.add_metric([dep], 1.0 if dr.get("drifted") else 0.0)
            for fig, v in (dr.get("figures") or {}).items():
                if isinstance(v, dict) and v.get("change_pct") is not None:
                    drift.add_metric([dep, fig], float(v["change_pct"]))
        yield from (decision, when, drifted, drift)


def metrics_text(store: Store) -> bytes:
    reg = CollectorRegistry()
    reg.register(_TunerCollector(store))
    return generate_latest(reg)
