"""Study configuration: one YAML file per study, validated with pydantic.

The schema is in :mod:`autotune.config.schema`, reading and validating a document (``${VAR}``
expansion, each value's line, one-line errors naming file, line and field) in
:mod:`autotune.config.loading`, the URL check in :mod:`autotune.config.urls`.
"""

from __future__ import annotations

from autotune.config.loading import (
    SourceMap,
    load_config,
    parse_config,
    parse_document,
    read_config_text,
    source_map,
)
from autotune.config.schema import (
    CAPACITY_REPEATS,
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    ONE_LEVEL_REPEATS,
    ConfigModel,
    ControllerConfig,
    ExtraParam,
    ModelConfig,
    RangeSpec,
    RecordConfig,
    SearchConfig,
    SloConfig,
    StrategyConfig,
    StudyConfig,
    TelemetryConfig,
    TwinConfig,
    ValidateConfig,
    WorkerConfig,
    WorkloadConfig,
)
from autotune.config.urls import check_http_url

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
    "RecordConfig",
    "SearchConfig",
    "SloConfig",
    "SourceMap",
    "StrategyConfig",
    "StudyConfig",
    "TelemetryConfig",
    "TwinConfig",
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
