"""The capacity lattice (pure; docs/tuning.md#1-the-capacity-lattice): the loads a capacity
search may measure, ``low * (1 + resolution)^(stride * k)`` for ``k = 0..top`` (the last point
not above ``high``). A ``stride`` above 1 gives a coarser lattice on the same points (a
validation run's, docs/tuning.md#7-validation, "A run's resolution")."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Lattice"]


@dataclass(frozen=True)
class Lattice:
    low: float
    high: float
    resolution: float
    stride: int = 1  # steps of ``resolution`` from one point to the next

    def __post_init__(self) -> None:
        if not (self.low > 0 and self.high >= self.low):
            raise ValueError(f"need 0 < low <= high, got low={self.low}, high={self.high}")
        if not self.resolution > 0:
            raise ValueError(f"resolution must be > 0, got {self.resolution}")
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride}")

    @property
    def top(self) -> int:
        """Index of the highest lattice point (not above ``high``)."""
        return math.floor(math.log(self.high / self.low) / self._log_step + 1e-9)

    def scale(self, k: int) -> float:
        if not 0 <= k <= self.top:
            raise ValueError(f"lattice index {k} outside 0..{self.top}")
        return self.low * (1.0 + self.resolution) ** (self.stride * k)

    @property
    def _log_step(self) -> float:
        return self.stride * math.log1p(self.resolution)

    def steps(self, ratio: float) -> float:
        """How many lattice points a load ``ratio`` spans (1.0201 at 1 %: 2.0)."""
        return math.log(ratio) / self._log_step

    def index(self, scale: float) -> int:
        """The lattice point nearest ``scale`` (clipped to the lattice)."""
        if scale <= 0:
            return 0
        k = round(math.log(scale / self.low) / self._log_step)
        return min(max(k, 0), self.top)
