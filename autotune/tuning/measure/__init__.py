"""How a config is measured: the runners that replay load levels on a worker, the capacity
lattice, scoring, one trial, the validation phase and its noise-aware verdict
(docs/tuning.md#1-the-capacity-lattice)."""

__all__: list[str] = []
