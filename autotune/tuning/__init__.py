"""Tuning: the fixed-order search space, scoring, strategies and the trial loop."""
