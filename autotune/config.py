"""Study configuration: one YAML file per study, validated with pydantic.

``${VAR}`` and ``${VAR:-default}`` are expanded in string values (not in keys) before
validation. Every error is one line naming the file, the line and the field, e.g.
``configs/x.yaml:12: slo.p99_ttft_ms: Input should be greater than 0``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autotune.errors import ConfigError

__all__ = [
    "ExtraParam",
    "ModelConfig",
    "RangeSpec",
    "SearchConfig",
    "SloConfig",
    "StrategyConfig",
    "StudyConfig",
    "TelemetryConfig",
    "WorkerConfig",
    "WorkloadConfig",
    "load_config",
    "parse_config",
]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Model):
    name: str = Field(description="built-in profile name, or a folder holding config.json")
    served_name: str | None = None
    config_json: str | None = Field(None, description="local config.json overriding the profile")


class WorkerConfig(_Model):
    kind: Literal["sim-virtual", "sim", "vllm"] = "sim-virtual"
    vllm_executable: list[str] = Field(default_factory=lambda: ["vllm"])
    static_args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    gpus: str | None = None
    host: str = "127.0.0.1"
    startup_timeout_s: float = Field(900.0, gt=0)
    workdir: str = ".autotune/workers"
    time_scale: float = Field(1.0, gt=0, description="sim worker: engine runs X times faster")
    sim_startup_delay_s: float = Field(0.0, ge=0)
    jitter_cv: float = Field(0.015, ge=0, le=0.5)


class WorkloadConfig(_Model):
    source: Literal["synthetic", "sharegpt-like", "random", "sharegpt", "mooncake", "azure",
                    "trace"] = "synthetic"
    path: str | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    num_prompts: int = Field(500, ge=1)
    duration_s: float | None = Field(None, gt=0)
    input_len: int = Field(512, ge=1)
    output_len: int = Field(128, ge=1)
    input_sigma: float = Field(0.5, ge=0)
    output_sigma: float = Field(0.5, ge=0)
    range_ratio: float = Field(0.0, ge=0, lt=1)
    arrival: Literal["poisson", "gamma", "constant", "trace", "closed", "all-at-once"] = "poisson"
    rate: float | None = Field(None, gt=0, description="requests/s at load scale 1.0")
    burstiness: float = Field(1.0, gt=0)
    concurrency: int | None = Field(None, ge=1, description="closed loop: requests in flight")
    time_scale: float = Field(1.0, gt=0)
    rate_scale: float = Field(1.0, gt=0)
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


class SloConfig(_Model):
    p99_ttft_ms: float | None = Field(None, gt=0)
    p99_tpot_ms: float | None = Field(None, gt=0)
    max_error_rate: float = Field(0.0, ge=0, le=1)
    max_overlength_rate: float = Field(0.01, ge=0, le=1)


class RangeSpec(_Model):
    low: float | None = None
    high: float | None = None
    log: bool | None = None
    candidates: list[int] | None = None

    @model_validator(mode="after")
    def _order(self) -> RangeSpec:
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class ExtraParam(_Model):
    name: str
    choices: list[Any] = Field(min_length=1)


class SearchConfig(_Model):
    max_model_len: RangeSpec = RangeSpec()
    gpu_memory_utilization: RangeSpec = RangeSpec()
    max_num_seqs: RangeSpec = RangeSpec()
    max_num_batched_tokens: RangeSpec = RangeSpec()
    max_model_len_margin: float = Field(0.1, ge=0, description="headroom over p95/p99/max")
    extra: list[ExtraParam] = Field(default_factory=list)


class StrategyConfig(_Model):
    name: Literal["staged", "joint"] = "staged"
    n_trials: int = Field(24, ge=1)
    trials_per_stage: int = Field(5, ge=1)
    joint_refinement: int = Field(0, ge=0)
    timeout_s: float | None = Field(None, gt=0)
    capacity_levels: int = Field(4, ge=2, le=12)
    capacity_low: float = Field(0.25, gt=0)
    capacity_high: float = Field(4.0, gt=0)


class TelemetryConfig(_Model):
    scrape_interval_s: float = Field(2.0, gt=0)
    prometheus_url: str | None = None
    # Prometheus mode: the file_sd targets file your Prometheus watches (see
    # configs/prometheus.yml); default <worker.workdir>/<study>/prometheus-targets.json
    sd_file: str | None = None
    # Make preemptions a constraint (any preemption at a level violates it); by default they
    # are counted, diagnosed and reported only.
    preemption_constraint: bool = False


class StudyConfig(_Model):
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
    storage: str | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _mode(self) -> StudyConfig:
        no_latency_slo = self.slo.p99_ttft_ms is None and self.slo.p99_tpot_ms is None
        if self.mode != "offline" and no_latency_slo:
            raise ValueError(f"mode {self.mode!r} needs at least one latency SLO "
                             "(slo.p99_ttft_ms or slo.p99_tpot_ms); use mode 'offline' for "
                             "throughput only")
        if self.mode == "offline" and self.workload.arrival != "closed":
            raise ValueError("mode 'offline' replays a closed loop: set workload.arrival to "
                             "'closed' with workload.concurrency")
        if self.mode == "slo-capacity" and self.workload.arrival == "closed":
            raise ValueError("mode 'slo-capacity' scales an arrival rate; a closed-loop workload "
                             "has none (use mode 'offline' or 'fixed-rate')")
        return self


# -- loading ---------------------------------------------------------------------------


def _expand(value: str, where: str) -> str:
    def repl(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable ${{{var}}} is not set "
                          f"(set it or write ${{{var}:-default}})")
    return _ENV.sub(repl, value)


def _to_python(node: yaml.Node, src: str, lines: dict[tuple[str | int, ...], int],
               path: tuple[str | int, ...]) -> Any:
    """Build Python values from the YAML node tree, remembering each value's line."""
    lines[path] = node.start_mark.line + 1
    where = f"{src}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else yaml.safe_load(yaml.serialize(k))
            out[str(key)] = _to_python(v, src, lines, (*path, str(key)))
            lines[(*path, str(key))] = k.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, src, lines, (*path, i)) for i, v in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    if node.tag == "tag:yaml.org,2002:str" or "${" in node.value:
        text = _expand(node.value, where) if "${" in node.value else node.value
        if node.tag != "tag:yaml.org,2002:str" or node.style is None:
            # an unquoted ${X} that expands to a number or bool becomes that type
            return yaml.safe_load(text) if text.strip() else text
        return text
    return yaml.safe_load(yaml.serialize(node))


def parse_config(text: str, source: str = "<config>") -> StudyConfig:
    """Validate a YAML document; errors name ``source``, the line and the field."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: invalid YAML ({problem})") from exc
    if node is None:
        raise ConfigError(f"{source}:1: the config is empty")
    lines: dict[tuple[str | int, ...], int] = {}
    data = _to_python(node, source, lines, ())
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of sections")
    try:
        return StudyConfig.model_validate(data)
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


def load_config(path: str | Path) -> StudyConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config ({exc.strerror or exc})") from exc
    return parse_config(text, str(p))
