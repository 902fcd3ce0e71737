"""The early-stop rule a study's config sets (docs/tuning.md#10-early-stop-inside-a-level).

The in-process simulator's watch that applies it, :class:`autotune.sim.SimWatch`, lives beside
the engine whose state it reads (docs/architecture.md); the HTTP load generator applies it in
:mod:`autotune.loadgen.stop_rule`.
"""

from __future__ import annotations

from autotune.config import StudyConfig
from autotune.loadgen.stop_rule import StopRule

__all__ = ["rule_of", "verdict_rule_of"]


def rule_of(cfg: StudyConfig) -> StopRule | None:
    """The early-stop rule of a study: its SLOs, in ``slo-capacity`` mode with
    ``strategy.early_stop`` on; None otherwise (fixed-rate and offline levels are the
    trial's result, figures and all, so they run to their end)."""
    return verdict_rule_of(cfg) if cfg.strategy.early_stop else None


def verdict_rule_of(cfg: StudyConfig) -> StopRule | None:
    """The rule that says when a level became certain to be infeasible, whether or not it
    stops the level: the study's SLOs in ``slo-capacity`` mode, None otherwise. A runner
    that replays a level to its end notes that point with it, so the sampler is told the same
    of an infeasible level with early stop on and off
    (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees")."""
    if cfg.mode != "slo-capacity":
        return None
    return StopRule.of(cfg.slo)
