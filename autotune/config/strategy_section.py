"""The study config's ``strategy`` section: the search, its validation phase and the twin."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from autotune.config.model_base import MAX_TIMEOUT_S, MAX_TRIALS, ConfigModel

__all__ = [
    "CAPACITY_REPEATS",
    "ONE_LEVEL_REPEATS",
    "StrategyConfig",
    "TwinConfig",
    "ValidateConfig",
]


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


class TwinConfig(ConfigModel):
    """The twin strategy (docs/tuning.md#15-the-twin-strategy): after the baseline, each
    real trial runs the config a calibrated simulator ranks best, refitted to every level
    measured so far."""

    # a calibrated profile (file:PATH, `autotune calibrate`) to start from; None: the
    # study's hardware profile
    profile: str | None = None
    # real trials after the baseline, at most
    real_trials: int = Field(5, ge=1, le=MAX_TRIALS)
    # CPU seconds per round (fit and screen); the screen measures configs on the twin in
    # virtual time until it is spent
    screen_cpu_s: float = Field(60.0, gt=0, le=3600.0)

    @field_validator("profile")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("file:"):
            raise ValueError(f"a calibrated profile is named file:PATH, got {v!r}")
        return v


class StrategyConfig(ConfigModel):
    # `validate` is a BaseModel method: the field is `validate_` in Python, `validate` in YAML
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )
    name: Literal["staged", "joint", "random", "grid", "twin"] = "staged"
    # upper bounds: a trial takes seconds at the very least, so more than MAX_TRIALS is a
    # typo (an extra zero or three), not a plan
    n_trials: int = Field(24, ge=1, le=MAX_TRIALS)
    trials_per_stage: int = Field(5, ge=1, le=MAX_TRIALS)
    # staged: joint trials (compass moves of the two concurrency knobs from the best point)
    # after the first pass, before the coordinate passes (docs/tuning.md#8-the-staged-plan);
    # 5 is what the tuning-quality benchmark measured
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
    # a trial that differs from a measured one only in a max_num_seqs neither engine reached
    # takes that trial's levels and starts no worker
    # (docs/tuning.md#14-settling-losing-trials, "A limit the engine never reached")
    infer: bool = True
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
    twin: TwinConfig = TwinConfig()

    @model_validator(mode="after")
    def _capacity_range(self) -> StrategyConfig:
        if self.capacity_low >= self.capacity_high:
            raise ValueError(
                f"capacity_low ({self.capacity_low:g}) must be below capacity_high "
                f"({self.capacity_high:g})"
            )
        return self
