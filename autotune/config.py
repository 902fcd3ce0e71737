"""Study configuration: one YAML file per study, validated with pydantic.

``${VAR}`` and ``${VAR:-default}`` are expanded in string values (not in keys) before
validation. Every error is one line naming the file, the line and the field, e.g.
``configs/x.yaml:12: slo.p99_ttft_ms: Input should be greater than 0``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autotune.errors import ConfigError
from autotune.inputs import (
    MAX_CONFIG_BYTES,
    check_number,
    check_text,
    check_yaml,
    clean_url,
    read_regular_file,
)

__all__ = [
    "CAPACITY_REPEATS",
    "MAX_TIMEOUT_S",
    "MAX_TRIALS",
    "ONE_LEVEL_REPEATS",
    "ConfigModel",
    "ControllerConfig",
    "ExtraParam",
    "ModelConfig",
    "RangeSpec",
    "SearchConfig",
    "SloConfig",
    "SourceMap",
    "StrategyConfig",
    "StudyConfig",
    "TelemetryConfig",
    "ValidateConfig",
    "WorkerConfig",
    "WorkloadConfig",
    "check_http_url",
    "load_config",
    "parse_config",
    "parse_document",
    "read_config_text",
    "source_map",
]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
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
    # 2 x 5 rather than the earlier 3 x 3: three repeats' t-interval (2.48 standard
    # deviations wide each side) said "keep" on real gains of +28 % and more in the
    # tuning-quality benchmark; five halve it (1.24), and the third candidate was rarely
    # chosen, so 15 runs instead of 12 (docs/tuning.md#7-validation)
    top_k: int = Field(2, ge=1)
    # 1 is allowed (a re-measurement without an interval: one run says nothing about noise).
    # None: by mode (StudyConfig.validation_repeats): 5 in slo-capacity, where a run is a
    # whole capacity search; 20 in offline and fixed-rate, where a run is one level, so 20
    # cost less than 5 capacity searches. Their figures are noisier per sample (an offline
    # throughput hangs on the few longest requests a sample draws, which drain alone at the
    # end): 5 repeats said "keep" on all three offline benchmark studies of a +3 % gain
    # (docs/tuning.md#7-validation)
    repeats: int | None = Field(None, ge=1)
    confidence: float = Field(0.95, gt=0, lt=1)


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
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")

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


# -- loading ---------------------------------------------------------------------------


def _expand(value: str, where: str) -> str:
    def repl(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable ${{{var}}} is not set "
            f"(set it or write ${{{var}:-default}})"
        )

    return _ENV.sub(repl, value)


Path_ = tuple[str | int, ...]


def _to_python(
    node: yaml.Node,
    src: str,
    lines: dict[Path_, int],
    path: Path_,
    expanded: set[Path_] | None = None,
) -> Any:
    """Build Python values from the YAML node tree, remembering each value's line (and, in
    ``expanded``, the paths of values that came from ``${VAR}``). A key given twice in one
    mapping is an error: YAML loaders keep the last one silently."""
    lines[path] = node.start_mark.line + 1
    where = f"{src}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:merge":
                raise ConfigError(
                    f"{src}:{k.start_mark.line + 1}: YAML merge keys (<<) are not supported; "
                    "write the fields out"
                )
            key = k.value if isinstance(k, yaml.ScalarNode) else yaml.safe_load(yaml.serialize(k))
            if str(key) in out:
                field = ".".join(str(p) for p in (*path, str(key)))
                raise ConfigError(
                    f"{src}:{k.start_mark.line + 1}: {field}: given twice (first on line "
                    f"{lines[(*path, str(key))]}); keep one"
                )
            out[str(key)] = _to_python(v, src, lines, (*path, str(key)), expanded)
            lines[(*path, str(key))] = k.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, src, lines, (*path, i), expanded) for i, v in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    if expanded is not None and "${" in node.value:
        expanded.add(path)
    if node.tag == "tag:yaml.org,2002:str" or "${" in node.value:
        text = _expand(node.value, where) if "${" in node.value else node.value
        if node.tag != "tag:yaml.org,2002:str" or node.style is None:
            # an unquoted ${X} that expands to a number or bool becomes that type
            return _load_scalar(text, where, path) if text.strip() else text
        return text
    return _load_scalar(yaml.serialize(node), where, path)


def _load_scalar(text: str, where: str, path: Path_) -> Any:
    """One value's YAML (a scalar, or what an unquoted ``${VAR}`` expanded to), with the
    document's limits (autotune.inputs.check_yaml) and one error line."""
    where = f"{where}: {'.'.join(str(p) for p in path) or '(top level)'}"
    check_yaml(text, where, lines=False)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:  # only from a ${VAR}'s text: the document parsed
        raise ConfigError(f"{where}: the expanded value is not valid YAML; quote it") from exc
    except ValueError as exc:
        # a date such as 2026-13-45, or an int over the 4,300 digits Python reads
        # (sys.get_int_max_str_digits); the value is not echoed: it may be megabytes long
        why = "a number of more than 4,300 digits" if "digits" in str(exc) else str(exc)
        raise ConfigError(f"{where}: cannot read the value ({why})") from exc


def _compose(text: str, source: str) -> yaml.Node:
    check_yaml(text, source)  # aliases, depth and size, before any node is built
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: invalid YAML ({problem})") from exc
    if node is None:
        raise ConfigError(f"{source}:1: the config is empty")
    return node


@dataclass(frozen=True)
class SourceMap:
    """Where each value of a config document is: its line, and whether it came from
    ``${VAR}`` (a secret written that way is not stored with the study)."""

    source: str
    lines: Mapping[Path_, int]
    expanded: frozenset[Path_]

    def where(self, path: Path_) -> str:
        """``file:line`` of the value at ``path`` (or of its nearest enclosing field)."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        return f"{self.source}:{self.lines.get(probe, 1)}"


def source_map(text: str, source: str = "<config>") -> SourceMap:
    """The :class:`SourceMap` of a document :func:`parse_config` accepted."""
    lines: dict[Path_, int] = {}
    expanded: set[Path_] = set()
    _to_python(_compose(text, source), source, lines, (), expanded)
    return SourceMap(source, lines, frozenset(expanded))


def parse_config(text: str, source: str = "<config>") -> StudyConfig:
    """Validate a YAML document; errors name ``source``, the line and the field."""
    return parse_document(text, source, StudyConfig)


M = TypeVar("M", bound=BaseModel)


def parse_document(text: str, source: str, model: type[M]) -> M:
    """Validate a YAML document as ``model`` (a study config, a nightly config, ...); every
    error is one line naming ``source``, the line and the field."""
    node = _compose(text, source)
    lines: dict[tuple[str | int, ...], int] = {}
    data = _to_python(node, source, lines, ())
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of sections")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        probe = loc
        lineno = lines.get(probe)
        while lineno is None and probe:
            probe = probe[:-1]
            lineno = lines.get(probe)
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see configs/ for examples)"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ConfigError(f"{source}:{lineno or 1}: {field}: {msg}{more}") from exc


def read_config_text(path: str | Path, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A config file's text: a regular file of at most ``max_bytes``, UTF-8; one error line
    if it cannot be read or decoded."""
    p = Path(path)
    data = read_regular_file(p, max_bytes, "config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{p}:{line}: the config is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start}); save it as UTF-8"
        ) from exc
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ConfigError(f"{p}:{line}: the config contains a NUL byte (is it a binary file?)")
    return text.removeprefix("\ufeff")


def load_config(path: str | Path) -> StudyConfig:
    return parse_config(read_config_text(path), str(Path(path)))


def check_http_url(url: str) -> None:
    """An http(s) URL with a host and, if given, a numeric port; the message never echoes a
    password (the study's and the nightly job's URLs)."""
    from urllib.parse import urlsplit

    shown = re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", url)
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{shown!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:9090)"
        )
    del port
