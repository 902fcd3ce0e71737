"""What the study store reads and writes: plain dataclasses, free of SQLAlchemy.

The study controller, the CLI and reports build and consume these; only
:mod:`autotune.store.db` knows how they map to tables. ``id`` and the timestamps are
filled in by the store (``None`` on a record that was never stored).

JSON-valued fields (``dict``/``list``) round-trip as JSON does: tuples come back as lists,
and non-finite floats (NaN, ±Infinity), which JSON cannot represent and PostgreSQL rejects,
come back as ``None``. A NaN in a plain float field also reads back as ``None`` (SQLite
cannot store NaN), so both backends answer alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "LevelRecord",
    "RepeatRecord",
    "RequestLog",
    "StudyRecord",
    "StudySummary",
    "TrialRecord",
    "WorkerUsage",
]


@dataclass(frozen=True)
class WorkerUsage:
    """What one worker cost on its devices, from its launch to its exit (docs/cost.md).

    ``worker_s``: launch to exit (idle time included); ``worker_startup_s``: the start-up
    part of it; ``replayed_s``: the load replayed on it (levels, the noise re-runs and
    warm-ups); ``devices_held``: the devices it held all that time. ``cost_modelled``: a
    simulated worker, whose start-up is the modelled start of vLLM on that GPU and whose
    load is counted in engine seconds; otherwise every figure was measured on the host's
    clock. A trial and a validation run store theirs in these same five fields.
    """

    worker_s: float
    worker_startup_s: float
    replayed_s: float
    devices_held: int
    cost_modelled: bool

    @property
    def gpu_s(self) -> float:
        """Device-seconds: the worker's lifetime times the devices it held."""
        return self.worker_s * self.devices_held

    def fields(self) -> dict[str, Any]:
        """The record fields that store it (``update_trial(**usage.fields())``): its own
        fields, which ``_WorkerCostFields`` repeats by name."""
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class _WorkerCostFields:
    """The five stored fields of a :class:`WorkerUsage`, which trials and validation runs
    share (keyword-only, after each record's own fields), read back as one by
    :attr:`usage` (None when the record has no worker: never launched, or stored before
    these fields existed)."""

    worker_s: float | None = None
    worker_startup_s: float | None = None
    replayed_s: float | None = None
    devices_held: int | None = None
    cost_modelled: bool | None = None

    @property
    def usage(self) -> WorkerUsage | None:
        if self.worker_s is None:
            return None
        return WorkerUsage(
            self.worker_s,
            self.worker_startup_s or 0.0,
            self.replayed_s or 0.0,
            self.devices_held or 1,
            bool(self.cost_modelled),
        )


@dataclass
class StudyRecord:
    """One autotune study; ``optuna_study_name`` names its Optuna study in the same DB."""

    name: str
    config_yaml: str
    workload_profile: dict[str, Any]
    mode: str
    worker_kind: str
    optuna_study_name: str
    created_at: datetime | None = None
    id: int | None = None


@dataclass
class LevelRecord:
    """One load level of a trial's capacity search (``scale`` times the base rate).

    The named columns are the fields of the typed per-level record
    (:class:`autotune.loadgen.level.LevelMetrics`, docs/tuning.md#3-the-per-level-record):
    ``error_rate`` and ``overlength_rate`` as defined there. ``violations`` names each
    constraint the level broke with its value and limit; ``metrics`` is the full
    ``vllm bench serve``-style result.
    """

    level_index: int
    scale: float
    offered_rate: float | None
    achieved_rate: float
    completed: int
    failed: int
    over_length: int
    error_rate: float
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    p99_itl_ms: float | None
    output_throughput: float
    request_throughput: float
    goodput: float | None
    feasible: bool
    metrics: dict[str, Any]
    telemetry: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    truncated: int = 0
    overlength_rate: float = 0.0
    violations: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None

    @property
    def violation_texts(self) -> list[str]:
        return [str(v.get("text", v.get("name"))) for v in self.violations]


@dataclass(frozen=True)
class RequestLog:
    """A stored level's per-request records (docs/loadgen.md#6-per-request-records):
    ``data`` is their requests-jsonl text, gzip-compressed, of ``requests`` lines and
    ``raw_bytes`` bytes before compression. The load generator writes and reads the text
    (:mod:`autotune.loadgen.request_log`); the store keeps the bytes."""

    requests: int
    raw_bytes: int
    data: bytes


@dataclass
class TrialRecord(_WorkerCostFields):
    """One Optuna trial: the engine config tried, how the worker fared, and its levels.

    ``state`` is ``"RUNNING"``, ``"COMPLETE"``, ``"PRUNED"`` (settled: it could not hold the
    best capacity so far, ``settled_below``, found by trial ``settled_against``;
    docs/tuning.md#14-settling-losing-trials) or ``"FAIL"``; ``params`` is what the sampler
    suggested and ``engine_args`` what was actually passed to vLLM (the two differ when
    extras are added or values are derived).
    """

    study_name: str
    optuna_trial_number: int
    stage: str
    state: str
    params: dict[str, Any]
    engine_args: dict[str, Any]
    launch_command: str | None
    launch_argv: list[str] | None
    worker_kind: str
    startup_s: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    failure_class: str | None = None
    log_tail: str | None = None
    objective: float | None = None
    constraints: list[float] = field(default_factory=list)
    feasible: bool | None = None
    capacity_scale: float | None = None
    diagnosis: dict[str, Any] | None = None
    levels: list[LevelRecord] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # the devices its worker saw (CUDA_VISIBLE_DEVICES, e.g. "0,1"); None when not set
    devices: str | None = None
    # settled: the load scale it failed to hold, and the trial whose capacity that was
    settled_below: float | None = None
    settled_against: int | None = None
    # inferred: the measured trial whose levels it took, starting no worker
    # (docs/tuning.md#14-settling-losing-trials, "A limit the engine never reached")
    inferred_from: int | None = None
    id: int | None = None

    def headline_level(self) -> LevelRecord | None:
        """The level that speaks for the trial: its highest-load level that met the SLOs,
        else its lowest load (the closest it came). Its p99s and diagnosis are the trial's."""
        ok = [lv for lv in self.levels if lv.feasible]
        if self.capacity_scale is not None:  # a re-measured point may hold once above it
            # (its majority failed, docs/tuning.md#1-the-capacity-lattice): not the trial's
            ok = [lv for lv in ok if lv.scale <= self.capacity_scale * (1 + 1e-9)] or ok
        if ok:
            return max(ok, key=lambda lv: lv.scale)
        return min(self.levels, key=lambda lv: lv.scale, default=None)


@dataclass
class StudySummary:
    """A row of ``autotune study list``.

    ``best_objective`` is the highest objective of a COMPLETE trial not marked infeasible
    (autotune's objectives — capacity, goodput, throughput — are all maximised).
    """

    name: str
    mode: str
    worker_kind: str
    created_at: datetime
    n_trials: int
    n_complete: int
    best_objective: float | None


@dataclass
class RepeatRecord(_WorkerCostFields):
    """One run of the validation phase (docs/tuning.md#7-validation): a stored trial's
    config re-measured on a fresh workload sample with fresh jitter, outside Optuna.

    ``repeat_index`` numbers the workload samples (runs of one repeat share theirs, so they
    pair up); ``position`` orders the runs within a repeat (rotated from repeat to repeat so
    that drift hits every config alike). ``state`` is ``"PENDING"``, ``"RUNNING"`` or
    ``"COMPLETE"``; each row is one unit of work. ``role`` is ``"baseline"`` or
    ``"candidate"``. ``slo_held``: the run met the latency and error SLOs (slo-capacity: at
    some load); the over-length limit is judged on all of a config's runs together.
    """

    study_name: str
    repeat_index: int
    position: int
    trial_number: int
    role: str
    engine_args: dict[str, Any]
    sample: str  # how the workload sample was drawn, e.g. "workload seed 123"
    workload_seed: int
    jitter_seed: int
    state: str = "PENDING"
    slo_held: bool | None = None
    capacity_scale: float | None = None
    objective: float | None = None  # output tok/s (at capacity in slo-capacity mode)
    worst_margin: float | None = None  # fixed-rate: max over latency SLOs of p99 / SLO
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    # requests max_model_len did not fit, of ``requests`` measured (load does not change it)
    overlength_rate: float | None = None
    requests: int = 0
    levels: int = 0
    failure_class: str | None = None
    violations: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    id: int | None = None
