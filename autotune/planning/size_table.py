"""``autotune size``'s table: one row per GPU type and tensor-parallel size
(docs/sizing.md#5-the-table). Pure: rows are built from a candidate's study, the per-replica
capacity, the replicated check and the user's prices; ranked by cost per hour when every row
has a price, else by GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.planning.candidate_study import CandidateResult
from autotune.planning.prices import Prices
from autotune.planning.replicas import ReplicaCheck, Target

__all__ = [
    "SIZE_SCHEMA_ID",
    "SizeReport",
    "SizeRow",
    "build_row",
    "rank_rows",
    "table_cells",
]

# the ``schema`` field of ``size --json``; its fields: docs/sizing.md#6-size---json
SIZE_SCHEMA_ID = "autotune.size/1"
_HOUR_S = 3600.0


@dataclass(frozen=True)
class SizeRow:
    """One candidate as a deployment. ``per_replica``: one replica's capacity (req/s for a
    rate target, streams for a concurrency target); ``output_tps_per_gpu`` and
    ``tps_per_user`` are the replicated check's, at the target load. Costs are None without
    a price; everything but the identity is None for a ``failure``."""

    hardware: str
    tensor_parallel_size: int
    study: str
    study_gpu_s: float
    replicas: int | None = None
    gpus: int | None = None
    per_replica: float | None = None
    capacity_bound: str = ""
    check: Literal["holds", "conservative", "fails"] | None = None
    check_text: str | None = None
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    output_tps: float | None = None
    output_tps_per_gpu: float | None = None
    tps_per_user: float | None = None
    price_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_1m_output_tokens: float | None = None
    engine_args: dict[str, Any] | None = None
    command: str | None = None
    failure: str | None = None
    # where the replicated check ran: "simulator" (the row's hardware profile), or the
    # worker kind of the one replica it ran on (docs/sizing.md#9-on-real-workers)
    check_on: str = "simulator"

    @property
    def usable(self) -> bool:
        """A deployment that meets the SLOs at the target (the check held or was
        conservative)."""
        return self.failure is None and self.check in ("holds", "conservative")

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["capacity_bound"] = self.capacity_bound or None
        return d


def build_row(
    c: CandidateResult,
    per_replica: float | None,
    check: ReplicaCheck | None,
    prices: Prices,
    failure: str | None = None,
) -> SizeRow:
    """The row of candidate ``c`` (``failure``: why it has no deployment)."""
    why = c.failure or failure
    if why is not None or check is None:
        return SizeRow(
            c.hardware,
            c.tensor_parallel_size,
            c.study,
            c.study_gpu_s,
            per_replica=per_replica,
            engine_args=c.engine_args,
            command=c.command,
            failure=why or "no replicated check",
        )
    n = check.replicas
    gpus = n * c.tensor_parallel_size
    run = check.at_n
    price = prices.get(c.hardware)
    per_hour = price * gpus if price is not None else None
    tokens_per_hour = run.output_tps * _HOUR_S
    per_1m = (
        per_hour / tokens_per_hour * 1e6
        if per_hour is not None and tokens_per_hour > 0 and run.meets
        else None
    )
    return SizeRow(
        c.hardware,
        c.tensor_parallel_size,
        c.study,
        c.study_gpu_s,
        replicas=n,
        gpus=gpus,
        per_replica=per_replica,
        capacity_bound=c.capacity_bound,
        check=check.verdict,
        check_text=check.text,
        p99_ttft_ms=run.p99_ttft_ms,
        p99_tpot_ms=run.p99_tpot_ms,
        output_tps=run.output_tps,
        output_tps_per_gpu=run.output_tps / gpus,
        tps_per_user=run.tps_per_user,
        price_per_gpu_hour=price,
        cost_per_hour=per_hour,
        cost_per_1m_output_tokens=per_1m,
        engine_args=c.engine_args,
        command=c.command,
    )


def rank_rows(rows: Sequence[SizeRow]) -> tuple[list[SizeRow], Literal["cost", "gpus"]]:
    """Usable rows first, by cost per hour when each has a price, else by GPUs (ties: more
    output tok/s per GPU first); then the rest in their order."""
    ok = [r for r in rows if r.usable]
    by_cost = bool(ok) and all(r.cost_per_hour is not None for r in ok)

    def key(r: SizeRow) -> tuple[float, float, float]:
        first = (r.cost_per_hour or 0.0) if by_cost else float(r.gpus or 0)
        return (first, float(r.gpus or 0), -(r.output_tps_per_gpu or 0.0))

    rest = [r for r in rows if not r.usable]
    return sorted(ok, key=key) + rest, ("cost" if by_cost else "gpus")


@dataclass(frozen=True)
class SizeReport:
    """The whole answer: the target, the ranked rows, what ranked them, and where the figures
    come from (``worker``: sim-virtual plans on the simulator)."""

    config_name: str
    target: Target
    slo: dict[str, Any]
    worker: str
    rows: list[SizeRow]
    ranked_by: Literal["cost", "gpus"]
    unpriced: list[str] = field(default_factory=list)

    @property
    def study_gpu_s(self) -> float:
        """Device-seconds of every candidate's study and real replica check."""
        return sum(r.study_gpu_s for r in self.rows)

    @property
    def provenance(self) -> str:
        """Which figures were measured and which simulated (docs/sizing.md#9-on-real-workers):
        on the real worker, the replicated check, and with it every figure at the target
        load, runs on one real replica at its share of the target."""
        if self.worker != "vllm":
            return "simulated"
        if self.target.kind == "rate":
            measured = "engine config, per-replica capacity"
        else:
            measured = "engine config (the streams per replica bisected on the simulator)"
        return (
            f"measured on vllm: {measured}, and the replica check with its latencies, tok/s "
            "and costs, on one replica at its share of the target (the deployment's tok/s: "
            "that many times its own)"
        )

    @property
    def winner(self) -> SizeRow | None:
        return self.rows[0] if self.rows and self.rows[0].usable else None

    def to_json(self) -> dict[str, Any]:
        w = self.winner
        return {
            "schema": SIZE_SCHEMA_ID,
            "config": self.config_name,
            "target": {"kind": self.target.kind, "value": self.target.value},
            "slo": self.slo,
            "worker": self.worker,
            "ranked_by": self.ranked_by,
            "unpriced": self.unpriced,
            "study_gpu_s": self.study_gpu_s,
            "winner": None if w is None else {"row": 0, "command": w.command},
            "rows": [r.to_dict() for r in self.rows],
        }


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table_cells(report: SizeReport) -> tuple[list[str], list[list[str]]]:
    """The table as text, for the terminal and the HTML page alike: its headers and one row
    of cells per row (rank, GPU type, TP, replicas, GPUs, one replica's capacity, the check's
    p99 TTFT and TPOT, output tok/s per GPU and per user, the check, cost per hour and per
    1M output tokens)."""
    unit = "req/s" if report.target.kind == "rate" else "streams"
    head = [
        "#",
        "hardware",
        "TP",
        "replicas",
        "GPUs",
        f"per replica ({unit})",
        "p99 TTFT ms",
        "p99 TPOT ms",
        "out tok/s per GPU",
        "tok/s per user",
        "check",
        "cost/h",
        "cost/1M out tok",
    ]
    rows: list[list[str]] = []
    for i, r in enumerate(report.rows, 1):
        per = "-" if r.per_replica is None else f"{r.capacity_bound}{r.per_replica:,.4g}"
        rows.append(
            [
                str(i) if r.usable else "-",
                r.hardware,
                str(r.tensor_parallel_size),
                _f(r.replicas, "d"),
                _f(r.gpus, "d"),
                per,
                _f(r.p99_ttft_ms, ",.0f"),
                _f(r.p99_tpot_ms, ",.1f"),
                _f(r.output_tps_per_gpu, ",.0f"),
                _f(r.tps_per_user, ",.1f"),
                r.check or f"n/a: {r.failure}",
                _f(r.cost_per_hour, ",.2f"),
                _f(r.cost_per_1m_output_tokens, ",.3f"),
            ]
        )
    return head, rows
