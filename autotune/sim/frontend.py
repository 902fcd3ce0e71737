"""The API server's own work: what vLLM's front end adds between the client and the engine.

vLLM runs its OpenAI server in its own process, apart from the engine core
(docs/simulator.md#34-the-api-server). That process renders each request's chat template and
tokenizes its prompt on a single worker thread, then hands it to the engine core; its asyncio
event loop receives every step the engine core returns, detokenizes each request's new token
and writes a stream chunk. Each of the two serializes its work: a burst of arrivals queues for
tokenizing, and a large batch's outputs queue for detokenizing. The engine core waits for
neither.

:class:`FrontEnd` models the two as FIFO servers on the engine's clock: ``admit`` says when
a request reaches the engine core, ``deliver`` when a step's tokens reach the clients. Pure
arithmetic on floats: the virtual loop and the HTTP server's driver both call it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from autotune.profiles.hardware import HardwareProfile

__all__ = [
    "DEFAULT_FRONT_END",
    "FRONT_END_PREFIX",
    "NO_FRONT_END",
    "FrontEnd",
    "FrontEndCosts",
    "front_end_of",
]


@dataclass(frozen=True, slots=True)
class FrontEndCosts:
    """Seconds of API-server work (docs/simulator.md#34-the-api-server).

    ``per_request``: parsing, validation, the chat template and the hand-off to the engine
    core, once per request; ``per_prompt_token``: tokenizing; ``per_step``: receiving and
    decoding one batch of engine-core outputs; ``per_output_token``: detokenizing one token
    and writing its stream chunk. ``engine_share`` is not seconds: the share of a step's
    output work (``per_step`` plus ``per_output_token`` per token) that the engine core's
    next step waits for, where the API server shares its CPU; 0 (the default) where it has
    a core of its own (docs/simulator.md#34-the-api-server). A calibrated profile may
    override any of them by name.
    """

    per_request: float
    per_prompt_token: float
    per_step: float
    per_output_token: float
    engine_share: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"front-end cost {f.name} must be >= 0")

    def replace(self, **overrides: float) -> FrontEndCosts:
        """These costs with ``overrides`` by field name (unknown names are an error)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(
                f"unknown front-end cost(s) {unknown}; valid: {', '.join(sorted(names))}"
            )
        values = {n: float(overrides.get(n, getattr(self, n))) for n in names}
        return FrontEndCosts(**values)


# Sources and ranges: docs/simulator.md#34-the-api-server.
DEFAULT_FRONT_END = FrontEndCosts(
    per_request=5.5e-3,
    per_prompt_token=3.0e-6,
    per_step=0.0,
    per_output_token=46e-6,
)
# The engine alone: requests reach it at their arrival and tokens leave at the step's end.
NO_FRONT_END = FrontEndCosts(0.0, 0.0, 0.0, 0.0)
# how a calibrated profile names its API-server costs in HardwareProfile.sim_overrides
FRONT_END_PREFIX = "front_end."


def front_end_of(hardware: HardwareProfile) -> FrontEndCosts:
    """The API server's costs on ``hardware``: a calibrated profile's fitted ones over the
    defaults (autotune.sim.twin)."""
    own = {
        k.removeprefix(FRONT_END_PREFIX): v
        for k, v in hardware.sim_overrides
        if k.startswith(FRONT_END_PREFIX)
    }
    return DEFAULT_FRONT_END.replace(**own) if own else DEFAULT_FRONT_END


class FrontEnd:
    """The API server's input thread and output loop as two FIFO servers; engine seconds.

    ``admit`` calls come in arrival order and ``deliver`` calls in step order; each waits
    behind its own server's backlog. Their contention for the process's one CPU (Python's
    GIL) is not modelled (docs/simulator.md#34-the-api-server).
    """

    __slots__ = ("costs", "input_free", "output_free")

    def __init__(self, costs: FrontEndCosts = DEFAULT_FRONT_END) -> None:
        self.costs = costs
        self.input_free = 0.0
        self.output_free = 0.0

    def admit(self, arrival: float, prompt_len: int) -> float:
        """When a request that arrived at ``arrival`` reaches the engine core."""
        c = self.costs
        work = c.per_request + c.per_prompt_token * prompt_len
        if work <= 0.0:
            return arrival
        self.input_free = max(arrival, self.input_free) + work
        return self.input_free

    def output_work(self, tokens: int) -> float:
        """Seconds of the output loop's work on one step's ``tokens``."""
        c = self.costs
        return c.per_step + c.per_output_token * tokens if tokens > 0 else 0.0

    def deliver(self, step_end: float, tokens: int) -> float:
        """When the ``tokens`` a step ending at ``step_end`` sampled reach their clients."""
        work = self.output_work(tokens)
        if work <= 0.0:
            return step_end
        self.output_free = max(step_end, self.output_free) + work
        return self.output_free
