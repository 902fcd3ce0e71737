"""The simulated vLLM engine: profiles, startup memory accounting, V1 scheduler, step cost
model, clocks. Pure logic; the HTTP server lives beside it and is the only I/O."""

__all__: list[str] = []
