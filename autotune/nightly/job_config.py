"""The nightly config (docs/nightly.md#1-the-nightly-config): one YAML file per deployment,
validated like study configs (``${VAR}`` expansion, one-line errors naming the file, the
line and the field).

It names the deployment, where today's traffic comes from (trace files, preferred, or
Prometheus), the model, hardware and worker, the SLOs and search space the dated studies
use, the drift thresholds, the budget and time window, the minimum gain to promote, the
output file and the dry-run switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from autotune.config import (
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    ConfigModel,
    ModelConfig,
    RecordConfig,
    SearchConfig,
    SloConfig,
    StrategyConfig,
    TelemetryConfig,
    WorkerConfig,
    check_http_url,
    parse_document,
    read_config_text,
)
from autotune.inputs import clean_url

__all__ = [
    "BudgetConfig",
    "DriftConfig",
    "NightlyConfig",
    "TrafficConfig",
    "load_nightly_config",
    "parse_nightly_config",
]

_ENGINE_KEYS = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")


class _Model(ConfigModel):
    """The study config's base: unknown fields refused, numbers finite, no booleans for
    counts (autotune.inputs.check_number)."""


class TrafficConfig(_Model):
    """Today's traffic: the newest trace file of ``dir`` (``pattern``), or Prometheus's
    ``vllm:request_*_tokens`` histograms and request rate over the last ``window_h``."""

    source: Literal["traces", "prometheus"] = "traces"
    dir: str | None = None
    pattern: str = "*.jsonl"
    format: Literal["trace", "mooncake", "azure"] = "trace"
    columns: dict[str, str] = Field(default_factory=dict)
    max_requests: int = Field(2000, ge=1, description="requests read from the newest file")
    time_scale: float = Field(1.0, gt=0)
    prometheus_url: str | None = None
    selector: str = Field("", description='PromQL label matchers, e.g. model_name="x"')
    window_h: float = Field(24.0, gt=0, description="the traffic window looked at")
    num_prompts: int = Field(1000, ge=1, description="prometheus: requests drawn from the fit")
    seed: int = 0

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            v = clean_url(v)
            check_http_url(v)
        return v

    @model_validator(mode="after")
    def _needs(self) -> TrafficConfig:
        if self.source == "traces" and not self.dir:
            raise ValueError("source 'traces' needs 'dir' (the folder the trace files land in)")
        if self.source == "traces" and self.format == "trace" and not self.columns:
            raise ValueError("format 'trace' needs 'columns' (a column mapping)")
        if self.source == "prometheus" and not self.prometheus_url:
            raise ValueError("source 'prometheus' needs 'prometheus_url'")
        return self


class DriftConfig(_Model):
    """What counts as drift against the profile behind the current recommendation."""

    length_pct: float = Field(15.0, gt=0, description="relative change of a length percentile")
    rate_pct: float = Field(20.0, gt=0, description="relative change of the mean request rate")
    share_over_pp: float = Field(
        1.0, gt=0, description="change, in percentage points, of the share over a max_model_len"
    )


class BudgetConfig(_Model):
    """The dated study's reduced budget and the job's time window."""

    n_trials: int = Field(8, ge=1, le=MAX_TRIALS)
    trials_per_stage: int = Field(2, ge=1, le=MAX_TRIALS)
    warm_top_k: int = Field(2, ge=0, description="the previous study's top configs enqueued")
    validate_top_k: int = Field(2, ge=1)
    repeats: int = Field(3, ge=2, description="validation repeats (an interval needs 2)")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="the study's time limit"
    )


class NightlyConfig(_Model):
    deployment: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)
    traffic: TrafficConfig
    model: ModelConfig
    hardware: str
    worker: WorkerConfig = WorkerConfig()
    slo: SloConfig
    mode: Literal["slo-capacity", "fixed-rate"] = "slo-capacity"
    search: SearchConfig = SearchConfig()
    strategy: StrategyConfig = StrategyConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    # the dated studies' record, and (record.git) each decision's commit (docs/git-record.md)
    record: RecordConfig = RecordConfig()
    incumbent: dict[str, Any] | None = Field(
        None, description="the engine args in use (first run; later the decisions say)"
    )
    drift: DriftConfig = DriftConfig()
    budget: BudgetConfig = BudgetConfig()
    min_gain_pct: float = Field(2.0, ge=0)
    output: str
    dry_run: bool = False
    storage: str | None = None
    seed: int = 0

    @field_validator("incumbent")
    @classmethod
    def _incumbent(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        unknown = sorted(set(v) - set(_ENGINE_KEYS))
        if unknown:
            raise ValueError(
                f"{unknown[0]!r} is not a tuned engine arg ({', '.join(_ENGINE_KEYS)})"
            )
        for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if key in v and not (isinstance(v[key], int) and v[key] >= 1):
                raise ValueError(f"{key}: must be a positive integer, got {v[key]!r}")
        util = v.get("gpu_memory_utilization")
        if util is not None and not (isinstance(util, int | float) and 0 < util <= 1):
            raise ValueError(f"gpu_memory_utilization: must lie in (0, 1], got {util!r}")
        return v

    @model_validator(mode="after")
    def _latency(self) -> NightlyConfig:
        if self.slo.p99_ttft_ms is None and self.slo.p99_tpot_ms is None:
            raise ValueError("slo: a nightly job needs a latency SLO (p99_ttft_ms or p99_tpot_ms)")
        return self


def parse_nightly_config(text: str, source: str = "<nightly config>") -> NightlyConfig:
    return parse_document(text, source, NightlyConfig)


def load_nightly_config(path: str | Path) -> NightlyConfig:
    return parse_nightly_config(read_config_text(path), str(Path(path)))
