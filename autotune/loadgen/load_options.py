"""What one load run is asked to do, as one typed record: the server's model and endpoint,
the concurrency limit, the warm-up, the bounds on sending and draining, the clock, the
request options and the summary's goodput SLOs and percentiles, and the early-stop rule
(docs/tuning.md#10-early-stop-inside-a-level). :func:`autotune.loadgen.runner.run_load`
takes it; what changes during a run (the progress callback, the caller's stop event) is
passed beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from autotune.loadgen.bench_stats import DEFAULT_PERCENTILES, summarize
from autotune.loadgen.client import DEFAULT_STALL_TIMEOUT, Endpoint, RequestOptions
from autotune.loadgen.stop_rule import StopRule

__all__ = ["LoadOptions"]


@dataclass(frozen=True)
class LoadOptions:
    """One load run's options.

    ``duration`` (engine seconds) stops sending: open-loop requests arriving at or after it
    and closed-loop requests that would start after it are not sent. ``drain_timeout``
    (wall seconds) then bounds the wait for requests in flight. ``time_scale``: engine
    seconds per wall second of the server. ``progress_interval``: wall seconds between
    progress snapshots. ``request_timeout`` and ``stall_timeout`` (wall seconds) bound one
    request. ``early_stop``: the rule that ends the run once the level's verdict is certain
    (None: every request is sent). ``observe``: without ``early_stop``, a rule that watches
    the run without ending it and notes where it would have
    (docs/tuning.md#10-early-stop-inside-a-level, "What the sampler sees").
    """

    model: str
    endpoint: Endpoint = "completions"
    api_key: str | None = None
    max_concurrency: int | None = None
    warmup: int = 0
    duration: float | None = None
    drain_timeout: float = 30.0
    time_scale: float = 1.0
    progress_interval: float = 0.5
    request_timeout: float | None = None
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
    temperature: float = 0.0
    ignore_eos: bool = True
    extra_body: Mapping[str, Any] | None = None
    goodput_slos: dict[str, float] | None = None
    percentiles: Sequence[float] = DEFAULT_PERCENTILES
    early_stop: StopRule | None = None
    observe: StopRule | None = None

    def validate(self) -> None:
        """Raise :class:`~autotune.errors.ConfigError` for an option no run can take (before
        anything is sent)."""
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be at least 1: {self.max_concurrency}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be a non-negative number of requests: {self.warmup}")
        if self.duration is not None and not self.duration > 0:
            raise ConfigError(f"duration must be positive: {self.duration}")
        if not self.drain_timeout >= 0:
            raise ConfigError(f"drain_timeout must be non-negative: {self.drain_timeout}")
        if not self.time_scale > 0:
            raise ConfigError(f"time_scale must be positive: {self.time_scale}")
        if self.endpoint not in ("completions", "chat"):
            raise ConfigError(
                f"unknown endpoint {self.endpoint!r}: expected 'completions' or 'chat'"
            )
        # the summary's own checks (goodput keys, percentiles), on no records: fail fast
        summarize([], 0.0, goodput_slos=self.goodput_slos, percentiles=self.percentiles)

    def request_options(self) -> RequestOptions:
        """What every request of the run is sent with."""
        return RequestOptions(
            model=self.model,
            endpoint=self.endpoint,
            api_key=self.api_key,
            timeout=self.request_timeout,
            stall_timeout=self.stall_timeout,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
            extra_body=self.extra_body,
        )
