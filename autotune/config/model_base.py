"""The base of every config model and the limits the sections share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from autotune.inputs import check_number, check_text

__all__ = ["MAX_TIMEOUT_S", "MAX_TRIALS", "SCALE_RANGE", "ConfigModel"]


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
