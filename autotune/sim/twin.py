"""A calibrated profile (the twin): a built-in GPU profile with constants fitted to one server.

The file (YAML, docs/simulator.md#10-calibrated-profiles) names its built-in base profile and
overrides, by name, the hardware efficiencies, the step cost's own constants and the API
server's costs; it records where and when it was measured and, per fitted constant, the
fit's uncertainty. ``--hardware file:PATH`` loads one wherever a GPU profile name goes.
Reading it is pure apart from the file read; a bad key or value is one line naming the file,
the line and the field, as for a study config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator

from autotune.config import ConfigModel
from autotune.config.loading import parse_document, read_config_text
from autotune.errors import ProfileError
from autotune.profiles.hardware import HardwareProfile, get_hardware
from autotune.sim.costs import (
    DEFAULT_EPS_ELEM,
    DEFAULT_T_FIXED,
    DEFAULT_T_REQ,
    HW_OVERRIDES,
    OWN_OVERRIDES,
)
from autotune.sim.frontend import FRONT_END_PREFIX, FrontEndCosts, front_end_of

__all__ = [
    "TWIN_PREFIX",
    "Measured",
    "Twin",
    "TwinFile",
    "dump_twin",
    "hardware_of",
    "is_twin_name",
    "load_twin",
    "twin_constants",
    "twin_hardware",
    "twin_mismatch",
]

# a GPU profile name that names a calibrated profile file instead
TWIN_PREFIX = "file:"
_FRONT_END = frozenset(f.name for f in fields(FrontEndCosts))


def _checked(v: dict[str, float], valid: frozenset[str], what: str) -> dict[str, float]:
    unknown = sorted(set(v) - valid)
    if unknown:
        raise ValueError(f"unknown {what} constant(s) {unknown}; valid: {', '.join(sorted(valid))}")
    bad = sorted(k for k, x in v.items() if not x >= 0)
    if bad:
        raise ValueError(f"{what} constant(s) {bad} must be >= 0")
    return v


class Measured(ConfigModel):
    """Where and when the constants were fitted (a study on another server is warned)."""

    vllm: str | None = None
    model: str | None = None
    host: str | None = None
    when: str | None = None


class TwinFile(ConfigModel):
    """The file as written; :func:`load_twin` turns it into a :class:`Twin`."""

    autotune_twin: Literal[1] = Field(description="the file format's version")
    base: str
    hardware: dict[str, float] = Field(default_factory=dict)
    cost: dict[str, float] = Field(default_factory=dict)
    front_end: dict[str, float] = Field(default_factory=dict)
    measured: Measured = Measured()
    # per fitted constant: its fit's standard error, and the fit's residuals by metric
    uncertainty: dict[str, float] = Field(default_factory=dict)
    residuals: dict[str, float] = Field(default_factory=dict)

    @field_validator("base")
    @classmethod
    def _base(cls, v: str) -> str:
        try:
            get_hardware(v)
        except ProfileError as exc:  # names the known ones; reported at this line
            raise ValueError(str(exc)) from exc
        return v

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, v: dict[str, float]) -> dict[str, float]:
        return _checked(v, HW_OVERRIDES, "hardware")

    @field_validator("cost")
    @classmethod
    def _cost(cls, v: dict[str, float]) -> dict[str, float]:
        return _checked(v, OWN_OVERRIDES, "cost")

    @field_validator("front_end")
    @classmethod
    def _front_end(cls, v: dict[str, float]) -> dict[str, float]:
        return _checked(v, _FRONT_END, "front_end")


@dataclass(frozen=True)
class Twin:
    """A base GPU profile with its overrides applied, as the simulated engine takes it."""

    source: str
    # the base with every override: the efficiencies as its fields, the step-cost and
    # API-server constants in sim_overrides, where the engine reads them
    hardware: HardwareProfile
    spec: TwinFile

    @property
    def name(self) -> str:
        return self.hardware.name

    @property
    def cost(self) -> dict[str, float]:
        """CostModel.build's own overrides (t_fixed, t_req, eps_elem)."""
        return dict(self.spec.cost)

    @property
    def front_end(self) -> FrontEndCosts:
        """The API server's costs the engine runs with on this profile."""
        return front_end_of(self.hardware)

    def text(self) -> str:
        """The line a run on the twin prints in place of the published-rows error."""
        m = self.spec.measured
        where = ", ".join(
            f"{k} {v}" for k, v in (("vLLM", m.vllm), ("model", m.model), ("host", m.host)) if v
        )
        res = ", ".join(f"{k} ±{v:.0f} %" for k, v in self.spec.residuals.items())
        out = f"simulated on the calibrated profile {self.source} (base {self.spec.base}"
        out += f"; fitted on {where}" if where else ""
        out += f"; its fit's residuals: {res}" if res else "; no fit residuals recorded"
        return out + ")"


def twin_constants(hardware: HardwareProfile) -> dict[tuple[str, str], float]:
    """Every constant a twin file may override, by (section, name), as ``hardware`` runs
    them: its efficiencies, its step-cost constants (a calibrated profile's, else the
    defaults) and its API server's costs. Calibration starts its fit from these."""
    own = dict(hardware.sim_overrides)
    cost = {
        "eps_elem": DEFAULT_EPS_ELEM,
        "t_fixed": DEFAULT_T_FIXED,
        "t_req": DEFAULT_T_REQ,
    }
    out = {("hardware", k): float(getattr(hardware, k)) for k in sorted(HW_OVERRIDES)}
    out |= {("cost", k): float(own.get(k, v)) for k, v in cost.items()}
    fe = front_end_of(hardware)
    out |= {("front_end", f.name): float(getattr(fe, f.name)) for f in fields(fe)}
    return out


def twin_mismatch(
    measured: Measured, *, vllm: str | None, model: str | None, host: str | None
) -> list[str]:
    """What differs between where a twin was fitted and the server a study runs: one phrase
    per known difference ("vLLM 0.31.0 here, 0.32.0 fitted"); unknown sides never count."""
    out = []
    for label, here, there in (
        ("vLLM", vllm, measured.vllm),
        ("model", model, measured.model),
        ("host", host, measured.host),
    ):
        if here and there and here != there:
            out.append(f"{label} {here} here, {there} fitted")
    return out


def is_twin_name(name: str) -> bool:
    return name.startswith(TWIN_PREFIX)


def load_twin(name_or_path: str | Path) -> Twin:
    """The twin a ``file:PATH`` name (or a path) names; a ConfigError names the bad line."""
    path = str(name_or_path).removeprefix(TWIN_PREFIX)
    spec = parse_document(read_config_text(path), path, TwinFile)
    return Twin(path, twin_hardware(spec, f"{TWIN_PREFIX}{path}"), spec)


def twin_hardware(spec: TwinFile, name: str) -> HardwareProfile:
    """``spec``'s base profile with its overrides applied, named ``name``: the efficiencies as
    its fields, the step-cost and API-server constants in ``sim_overrides`` (where the engine
    reads them). Pure: calibration builds candidates with it before any file exists."""
    over: dict[str, Any] = dict(spec.hardware)  # efficiency fields only (validated)
    sim = {**spec.cost, **{f"{FRONT_END_PREFIX}{k}": v for k, v in spec.front_end.items()}}
    return replace(
        get_hardware(spec.base), name=name, sim_overrides=tuple(sorted(sim.items())), **over
    )


def hardware_of(name: str) -> HardwareProfile:
    """The GPU profile a study or command names: a built-in one, or ``file:PATH``'s
    calibrated profile (its constants carried in ``sim_overrides``)."""
    return load_twin(name).hardware if is_twin_name(name) else get_hardware(name)


def dump_twin(spec: TwinFile) -> str:
    """The YAML text of a twin file; :func:`load_twin` reads it back to the same spec."""
    data: dict[str, Any] = spec.model_dump(exclude_defaults=False)
    return yaml.safe_dump(data, sort_keys=False)
