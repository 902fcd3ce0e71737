"""When a level's infeasible verdict became certain (docs/tuning.md#10-early-stop-inside-a-level,
"What the sampler sees"): the SLO the early-stop rule found broken, and how many of the
level's planned requests had been sent by then.

A stopped level's point is its stop's. A level that ran to its end with the rule watching
without stopping (``strategy.early_stop: false``) records the point at which the rule would
have stopped it, under the ``verdict_at`` key of its stored metrics (:meth:`VerdictAt.stored`
writes it, :meth:`VerdictAt.of` reads it). On the in-process simulator both come from the
same replay up to that point, so the point is the same with early stop on and off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["VerdictAt"]

_KEY = "verdict_at"  # the observed point's key in a stored level's metrics


@dataclass(frozen=True)
class VerdictAt:
    """``reason`` (``p99_ttft``, ``p99_tpot``, ``error_rate``): the SLO the rule found broken;
    ``at_request``: measured requests sent by then, of ``planned``."""

    reason: str
    at_request: int
    planned: int

    @property
    def share_left(self) -> float:
        """The share of the level still to be sent when the verdict came, counting the
        request that decided it: in ``(0, 1]``, small for a level that broke its SLO only at
        its end, 1 for one certain before its second request."""
        n = max(self.planned, 1)
        return min(max(n - self.at_request + 1, 1), n) / n

    def stored(self) -> dict[str, Any]:
        """``{"verdict_at": {...}}``, the shape :meth:`of` reads."""
        return {
            _KEY: {
                "reason": self.reason,
                "at_request": self.at_request,
                "planned_requests": self.planned,
            }
        }

    @classmethod
    def of(cls, metrics: Mapping[str, Any] | None) -> VerdictAt | None:
        """The observed point a stored level's ``metrics`` record; None when none was."""
        d = (metrics or {}).get(_KEY)
        if not isinstance(d, Mapping):
            return None
        return cls(
            str(d.get("reason")),
            int(d.get("at_request") or 0),
            int(d.get("planned_requests") or 0),
        )
