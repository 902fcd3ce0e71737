"""Calibration: fit the simulated engine to one server (docs/calibrate.md).

A short probe suite runs against a live server (or a study's recorded levels are read), the
simulator's step-cost and API-server constants are fitted to what it measured, and the result
is a calibrated profile, the twin, that ``--hardware file:PATH`` loads.
"""

from __future__ import annotations

from autotune.calibrate.measured_levels import LevelTarget, level_observations
from autotune.calibrate.observe import Observation, Timing, observe
from autotune.calibrate.probes import Probe, default_suite
from autotune.calibrate.twin_fit import (
    DEFAULT_FITTED,
    FIT_STARTS,
    Calibration,
    fit_twin,
    predict,
)

__all__ = [
    "DEFAULT_FITTED",
    "FIT_STARTS",
    "Calibration",
    "LevelTarget",
    "Observation",
    "Probe",
    "Timing",
    "default_suite",
    "fit_twin",
    "level_observations",
    "observe",
    "predict",
]
