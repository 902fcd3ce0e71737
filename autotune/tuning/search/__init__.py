"""Where the next trial goes: the fixed-order search space, the baseline and the staged
plan, the strategies and the line search (docs/tuning.md#8-the-staged-plan). Pure logic."""

__all__: list[str] = []
