"""Tuning: the fixed-order search space, scoring, strategies and the trial loop."""

__all__: list[str] = []
