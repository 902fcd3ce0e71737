"""The study config's schema: one pydantic model per YAML section, the study's checks
across sections, and the limits they share.

Every model derives from :class:`ConfigModel` (the nightly job's config too): unknown fields,
booleans in numeric fields, infinities and NULs are refused at their field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autotune.config.urls import check_http_url
from autotune.inputs import check_number, check_text, clean_url

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
    "SearchConfig",
    "SloConfig",
    "StrategyConfig",
    "StudyConfig",
    "TelemetryConfig",
    "ValidateConfig",
    "WorkerConfig",
    "WorkloadConfig",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
# CUDA_VISIBLE_DEVICES: device indices or UUIDs (GPU-..., MIG-...), comma-separated
_GPUS = re.compile(r"^[A-Za-z0-9_-]+(,[A-Za-z0-9_-]+)*$")


# The most trials one study or run may ask for, and the longest time limit (a year): sane
# upper bounds that still refuse `n_trials: 1000000000000` and `timeout: inf`; the CLI's
# --n-trials and --timeout share them.
MAX_TRIALS = 100_000
MAX_TIMEOUT_S = 365 * 86400.0
# workload.rate (requests/s) and the trace scales: one request in 11.6 days to a million a second
SCALE_RANGE = (1e-6, 1e6)


# the base of every config model, the nightly job's included (no docstring: pydantic would
# make it the JSON schema's description)
class ConfigModel(BaseModel):
    # allow_inf_nan=False: `rate: .inf` / `.nan` are refused at their field as "a finite
    # number" rather than failing later, far from the line (docs/bad-input.md)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `n_trials: true` as 1; autotune.inputs.check_number
        # refuses booleans in numeric fields and integers beyond 64 bits, check_text NULs
        if info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            check_number(v, annotation)
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                check_text(v)  # a section checks its own fields, each named in the error
        return v


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

    @model_validator(mode="after")
    def _candidates(self) -> SearchConfig:
        for name in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name).candidates is not None:
                raise ValueError(
                    f"{name}.candidates: only max_model_len takes candidates "
                    f"(give {name} a low and a high)"
                )
        return self


# default validation repeats per config (ValidateConfig.repeats explains the two)
CAPACITY_REPEATS = 5
ONE_LEVEL_REPEATS = 20


class ValidateConfig(ConfigModel):
    """The validation phase after the search (docs/tuning.md#7-validation): the top
    ``top_k`` configs and the baseline re-measured ``repeats`` times each on fresh workload
    samples, compared by a paired t-interval at ``confidence``."""

    enabled: bool = True
    # 2 x 5 rather than 3 x 3: three repeats' t-interval said "keep" on real gains of +28 %
    # and more in the tuning-quality benchmark (docs/tuning.md#7-validation, "Why 2 x 5")
    top_k: int = Field(2, ge=1)
    # 1 is allowed (no interval). None: by mode (StudyConfig.validation_repeats): 5 in
    # slo-capacity; 20 in offline and fixed-rate, where a run is one level, and an offline
    # throughput hangs on the few longest requests a sample draws: 5 repeats said "keep" on
    # all three offline benchmark studies of a +3 % gain (docs/tuning.md#7-validation)
    repeats: int | None = Field(None, ge=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    # slo-capacity: each run's search starts at the config's capacity in the study, at the
    # decision boundary, instead of the lattice's ends (docs/tuning.md#7-validation)
    from_capacity: bool = True
    # stop once the runs so far settle the verdict (docs/tuning.md#7-validation, "Stopping early")
    stop_early: bool = True


class StrategyConfig(ConfigModel):
    # `validate` is a BaseModel method: the field is `validate_` in Python, `validate` in YAML
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )
    name: Literal["staged", "joint", "random", "grid"] = "staged"
    # upper bounds: a trial takes seconds at the very least, so more than MAX_TRIALS is a
    # typo (an extra zero or three), not a plan
    n_trials: int = Field(24, ge=1, le=MAX_TRIALS)
    trials_per_stage: int = Field(5, ge=1, le=MAX_TRIALS)
    # staged: multivariate TPE trials after the first pass, before the coordinate passes
    # (docs/tuning.md#8-the-staged-plan); 5 is what the tuning-quality benchmark measured
    joint_refinement: int = Field(5, ge=0)
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="a run's default time limit"
    )
    # slo-capacity: loads lie on the lattice capacity_low * (1 + capacity_resolution)^k up to
    # capacity_high (docs/tuning.md#1-the-capacity-lattice); capacity_levels caps the levels
    # one trial may measure (a safety net: a search needs about log2(lattice size) + 2).
    capacity_levels: int = Field(24, ge=2)
    capacity_low: float = Field(0.25, gt=0)
    capacity_high: float = Field(4.0, gt=0)
    capacity_resolution: float = Field(0.01, gt=0, le=1)
    # slo-capacity: end a level as soon as its verdict is certain
    # (docs/tuning.md#10-early-stop-inside-a-level)
    early_stop: bool = True
    # a trial failing the best capacity so far is settled (docs/tuning.md#14-settling-losing-trials)
    settle: bool = True
    # every level lasts at least min_level_s engine seconds at its load and holds at least
    # min_level_requests requests, the sample looped when it is shorter; 0 turns a minimum off
    # (docs/tuning.md#13-level-length). Capped at a day and a million requests: the looped
    # level is held in memory, and more than that is a typo, not a plan
    min_level_s: float = Field(30.0, ge=0, le=86400.0)
    min_level_requests: int = Field(200, ge=0, le=1_000_000)
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    # a study's device-time budget: no trial starts that would leave too little for the
    # validation phase (docs/cost.md#3-the-plan-and-the-budget); None: no budget
    gpu_hours: float | None = Field(None, gt=0, le=1e6)

    @model_validator(mode="after")
    def _capacity_range(self) -> StrategyConfig:
        if self.capacity_low >= self.capacity_high:
            raise ValueError(
                f"capacity_low ({self.capacity_low:g}) must be below capacity_high "
                f"({self.capacity_high:g})"
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
