"""What autotune knows about the engine it tunes, shared by the simulator, the workers and
planning (docs/architecture.md): one low layer so none of them imports another for it.

- :mod:`autotune.profiles.hardware`: GPU profiles.
- :mod:`autotune.profiles.models`: model profiles and ``config.json`` reading.
- :mod:`autotune.profiles.flags`: vLLM 0.32's ``serve`` flags (``vllm_flags.json``).
"""

__all__: list[str] = []
