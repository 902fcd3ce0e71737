"""The study config's schema: one pydantic model per YAML section, the study's checks
across sections, and the limits they share.

Every model derives from :class:`ConfigModel` (the nightly job's config too): unknown fields,
booleans in numeric fields, infinities and NULs are refused at their field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autotune.config.model_base import MAX_TIMEOUT_S, MAX_TRIALS, SCALE_RANGE, ConfigModel
from autotune.config.record_section import RecordConfig
from autotune.config.strategy_section import (
    CAPACITY_REPEATS,
    ONE_LEVEL_REPEATS,
    StrategyConfig,
    TwinConfig,
    ValidateConfig,
)
from autotune.config.urls import check_http_url
from autotune.inputs import clean_url

__all__ = [
    "CAPACITY_REPEATS",
    "MAX_TIMEOUT_S",
    "MAX_TRIALS",
    "ONE_LEVEL_REPEATS",
    "SCALE_RANGE",
    "ConfigModel",
    "ControllerConfig",
    "ExtraParam",
    "ModelConfig",
    "RangeSpec",
    "RecordConfig",
    "SearchConfig",
    "SloConfig",
    "StrategyConfig",
    "StudyConfig",
    "TelemetryConfig",
    "TwinConfig",
    "ValidateConfig",
    "WorkerConfig",
    "WorkloadConfig",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
# CUDA_VISIBLE_DEVICES: device indices or UUIDs (GPU-..., MIG-...), comma-separated
# parallel sizes the parallelism stage owns when it runs (workers.devices.PARALLEL_FLAGS' names;
# config sits below workers, so the names are listed here for the check)
_PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_GPUS = re.compile(r"^[A-Za-z0-9_-]+(,[A-Za-z0-9_-]+)*$")


class ModelConfig(ConfigModel):
    name: str = Field(description="built-in profile name, or a folder holding config.json")
    served_name: str | None = None
    config_json: str | None = Field(None, description="local config.json overriding the profile")


class WorkerConfig(ConfigModel):
    kind: Literal["sim-virtual", "sim", "vllm"] = "sim-virtual"
    vllm_executable: list[str] = Field(default_factory=lambda: ["vllm"], min_length=1)
    static_args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # names copied from the controller's environment on top of the allow-list
    # (autotune.workers.env); a trailing * matches a prefix, e.g. MY_PLUGIN_*
    env_passthrough: list[str] = Field(default_factory=list)
    gpus: str | None = None
    host: str = "127.0.0.1"
    startup_timeout_s: float = Field(900.0, gt=0, le=MAX_TIMEOUT_S)
    workdir: str = ".autotune/workers"
    time_scale: float = Field(1.0, gt=0, description="sim worker: engine runs X times faster")
    sim_startup_delay_s: float = Field(0.0, ge=0)
    jitter_cv: float = Field(0.015, ge=0, le=0.5)

    @field_validator("vllm_executable")
    @classmethod
    def _executable(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the first element must name the vllm program")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:  # a NUL in a value is refused for every field (ConfigModel)
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return v

    @field_validator("env_passthrough")
    @classmethod
    def _passthrough(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _ENV_PATTERN.match(name):
                raise ValueError(
                    f"{name!r} is not an environment variable name (a trailing * matches a prefix)"
                )
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: str | None) -> str | None:
        if v is not None and v.strip().lower() == "all":
            # CUDA would read CUDA_VISIBLE_DEVICES=all as no device at all; the run resolves
            # `--gpus all` to the host's or pod's devices instead
            # (docs/scale-out.md#3-the-devices-of-a-pod)
            raise ValueError(
                "'all' is not a device list here: leave worker.gpus unset and run "
                "`autotune study run NAME --gpus all`, which finds the devices at run time"
            )
        if v is not None and not _GPUS.match(v):
            raise ValueError(
                f"{v!r} is not a device list: write indices or UUIDs separated by commas, "
                "e.g. '0,1'"
            )
        return v

    @field_validator("static_args")
    @classmethod
    def _flag_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not re.match(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                raise ValueError(f"{name!r} is not a flag name (write e.g. enforce_eager)")
        return v


class WorkloadConfig(ConfigModel):
    source: Literal[
        "synthetic", "sharegpt-like", "random", "sharegpt", "mooncake", "azure", "trace"
    ] = "synthetic"
    path: str | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    num_prompts: int = Field(500, ge=1)
    input_len: int = Field(512, ge=1)
    output_len: int = Field(128, ge=1)
    # a lognormal sigma of 10 already spreads lengths over dozens of orders of magnitude;
    # 1e300 overflowed sigma^2 in the length sampler
    input_sigma: float = Field(0.5, ge=0, le=10)
    output_sigma: float = Field(0.5, ge=0, le=10)
    range_ratio: float = Field(0.0, ge=0, lt=1)
    arrival: Literal["poisson", "gamma", "constant", "trace", "closed", "all-at-once"] = "poisson"
    rate: float | None = Field(None, gt=0, description="requests/s at load scale 1.0")
    burstiness: float = Field(1.0, gt=0)
    concurrency: int | None = Field(None, ge=1, description="closed loop: requests in flight")
    time_scale: float = Field(1.0, gt=0)
    rate_scale: float = Field(1.0, gt=0)

    @field_validator("rate", "time_scale", "rate_scale")
    @classmethod
    def _sane_scale(cls, v: float | None, info: ValidationInfo) -> float | None:
        # a rate of 1e-300 req/s put arrivals beyond any integer second (docs/bad-input.md)
        if v is not None and not SCALE_RANGE[0] <= v <= SCALE_RANGE[1]:
            raise ValueError(
                f"{v:g} is outside {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g}"
                + (" requests/s" if info.field_name == "rate" else "")
            )
        return v

    warmup: int = Field(0, ge=0)
    peak_concurrency: int | None = Field(None, ge=1)
    endpoint: Literal["completions", "chat"] = "completions"
    seed: int = 0

    @model_validator(mode="after")
    def _needs(self) -> WorkloadConfig:
        if self.source in ("sharegpt", "mooncake", "azure", "trace") and not self.path:
            raise ValueError(f"source {self.source!r} needs 'path'")
        if self.source == "trace" and not self.columns:
            raise ValueError("source 'trace' needs 'columns' (a column mapping)")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ValueError(f"arrival {self.arrival!r} needs 'rate'")
        if self.arrival == "closed" and self.concurrency is None:
            raise ValueError("arrival 'closed' needs 'concurrency'")
        return self


class SloConfig(ConfigModel):
    p99_ttft_ms: float | None = Field(None, gt=0)
    p99_tpot_ms: float | None = Field(None, gt=0)
    max_error_rate: float = Field(0.0, ge=0, le=1)
    max_overlength_rate: float = Field(0.01, ge=0, le=1)


class RangeSpec(ConfigModel):
    low: float | None = None
    high: float | None = None
    candidates: list[int] | None = None

    @model_validator(mode="after")
    def _order(self) -> RangeSpec:
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class ExtraParam(ConfigModel):
    name: str
    choices: list[Any] = Field(min_length=1)


class SearchConfig(ConfigModel):
    max_model_len: RangeSpec = RangeSpec()
    gpu_memory_utilization: RangeSpec = RangeSpec()
    max_num_seqs: RangeSpec = RangeSpec()
    max_num_batched_tokens: RangeSpec = RangeSpec()
    max_model_len_margin: float = Field(0.1, ge=0, description="headroom over p95/p99/max")
    extra: list[ExtraParam] = Field(default_factory=list)
    # the parallelism stage ahead of max_model_len: tensor_parallel_size over the sizes the
    # model allows on this many devices, scored per device (docs/tuning.md#16-the-parallelism-stage)
    parallelism: int | None = Field(None, ge=1, le=64, description="most devices per trial")

    @model_validator(mode="after")
    def _candidates(self) -> SearchConfig:
        for name in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name).candidates is not None:
                raise ValueError(
                    f"{name}.candidates: only max_model_len takes candidates "
                    f"(give {name} a low and a high)"
                )
        return self


class TelemetryConfig(ConfigModel):
    scrape_interval_s: float = Field(2.0, gt=0)
    prometheus_url: str | None = None

    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None:
            v = clean_url(v)
            check_http_url(v)
        return v

    # Prometheus mode: the file_sd targets file your Prometheus watches (see
    # configs/prometheus.yml); default <worker.workdir>/<study>/prometheus-targets.json
    sd_file: str | None = None
    # Make preemptions a constraint (any preemption at a level violates it); by default they
    # are counted, diagnosed and reported only.
    preemption_constraint: bool = False


class ControllerConfig(ConfigModel):
    """How the controllers sharing a study notice each other's death and ride out database
    outages (docs/faults.md#6-settings). Whole seconds where Optuna takes whole seconds."""

    heartbeat_interval_s: int = Field(5, ge=1)
    grace_period_s: int = Field(60, ge=2)
    db_outage_tolerance_s: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _grace_outlasts_outage(self) -> ControllerConfig:
        need = self.db_outage_tolerance_s + 2 * self.heartbeat_interval_s
        if self.grace_period_s < need:
            raise ValueError(
                f"grace_period_s ({self.grace_period_s}) must be at least "
                f"db_outage_tolerance_s + 2 x heartbeat_interval_s ({need:g}): a database "
                "outage the controllers ride out must never make a live trial look stale"
            )
        return self


class StudyConfig(ConfigModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    model: ModelConfig
    hardware: str
    worker: WorkerConfig = WorkerConfig()
    workload: WorkloadConfig
    slo: SloConfig = SloConfig()
    mode: Literal["slo-capacity", "fixed-rate", "offline"] = "slo-capacity"
    search: SearchConfig = SearchConfig()
    enqueue: list[dict[str, Any]] = Field(default_factory=list)
    strategy: StrategyConfig = StrategyConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    controller: ControllerConfig = ControllerConfig()
    record: RecordConfig = RecordConfig()
    storage: str | None = None
    seed: int = 0

    @property
    def validation_repeats(self) -> int:
        """Validation repeats per config: ``strategy.validate.repeats``, else the mode's
        default (one-level modes get more: each of their runs replays one level)."""
        r = self.strategy.validate_.repeats
        if r is not None:
            return r
        return CAPACITY_REPEATS if self.mode == "slo-capacity" else ONE_LEVEL_REPEATS

    @model_validator(mode="after")
    def _parallelism(self) -> StudyConfig:
        if self.search.parallelism is None:
            return self
        if self.mode != "slo-capacity":
            raise ValueError(
                "search.parallelism compares sizes by SLO capacity per device: it needs mode "
                f"'slo-capacity', not {self.mode!r}"
            )
        fixed = [k for k in self.worker.static_args if k.replace("-", "_") in _PARALLEL_ARGS]
        fixed += [e.name for e in self.search.extra if e.name.replace("-", "_") in _PARALLEL_ARGS]
        if fixed:
            raise ValueError(
                f"search.parallelism searches tensor_parallel_size itself: remove {fixed[0]} "
                "from worker.static_args or search.extra"
            )
        return self

    @model_validator(mode="after")
    def _mode(self) -> StudyConfig:
        no_latency_slo = self.slo.p99_ttft_ms is None and self.slo.p99_tpot_ms is None
        if self.mode != "offline" and no_latency_slo:
            raise ValueError(
                f"mode {self.mode!r} needs at least one latency SLO "
                "(slo.p99_ttft_ms or slo.p99_tpot_ms); use mode 'offline' for "
                "throughput only"
            )
        if self.mode == "offline" and self.workload.arrival != "closed":
            raise ValueError(
                "mode 'offline' replays a closed loop: set workload.arrival to "
                "'closed' with workload.concurrency"
            )
        if self.mode == "slo-capacity" and self.workload.arrival == "closed":
            raise ValueError(
                "mode 'slo-capacity' scales an arrival rate; a closed-loop workload "
                "has none (use mode 'offline' or 'fixed-rate')"
            )
        return self
