"""The records the load generator and the simulator consume: one request, one workload.

A request carries its lengths and at most two forms of content. Sources whose content
matters (shared prefixes: Mooncake hash ids, vLLM random's fixed prefix) or is given (ShareGPT
text) store it; the rest store lengths only, and :meth:`WorkloadRequest.prompt` derives a
deterministic prompt from the request id when it is sent. That keeps a 20k-row trace from
holding tens of millions of token ids nobody needs.

Arrival semantics: seconds from the start of the run; ``0.0`` for every request is vLLM's
``--request-rate inf`` (all at once); ``None`` for every request plus
``closed_loop_concurrency`` is a closed loop (a new request as soon as one finishes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from autotune.errors import ConfigError
from autotune.workload.profile import WorkloadProfile, fingerprint, profile_of
from autotune.workload.text import (
    DEFAULT_VOCAB_SIZE,
    random_token_ids,
    stable_seed,
    text_for_token_ids,
    text_of_length,
)

__all__ = ["Workload", "WorkloadRequest"]


@dataclass(frozen=True)
class WorkloadRequest:
    """One request to send: lengths, optional content, arrival offset (s) and id."""

    prompt_len: int
    output_len: int
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    arrival: float | None = 0.0
    request_id: str = ""

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(
                f"request {self.request_id!r}: prompt_len and output_len must be "
                f">= 1, got {self.prompt_len} and {self.output_len}"
            )
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(
                f"request {self.request_id!r}: prompt_len {self.prompt_len} != "
                f"len(prompt_token_ids) {len(self.prompt_token_ids)}"
            )
        if self.arrival is not None and not (math.isfinite(self.arrival) and self.arrival >= 0):
            raise ValueError(
                f"request {self.request_id!r}: arrival must be a finite offset "
                f">= 0 s, got {self.arrival}"
            )

    def prompt(
        self, accepts_token_ids: bool, vocab_size: int = DEFAULT_VOCAB_SIZE
    ) -> str | list[int]:
        """The prompt to send: token ids when the target takes them and the request has or
        can make them, else text of about ``prompt_len`` tokens.

        Stored text wins over generated ids (ShareGPT content is real); stored ids become
        text word for word, so shared id prefixes stay shared text prefixes.
        """
        if accepts_token_ids and self.prompt_text is None:
            if self.prompt_token_ids is not None:
                return list(self.prompt_token_ids)
            rng = np.random.default_rng(stable_seed("prompt", self.request_id))
            return list(random_token_ids(rng, self.prompt_len, vocab_size))
        if self.prompt_text is not None:
            return self.prompt_text
        if self.prompt_token_ids is not None:
            return text_for_token_ids(self.prompt_token_ids)
        return text_of_length(self.prompt_len, seed=self.request_id)


@dataclass
class Workload:
    """Requests in send order, a description of where they came from, and the loop mode."""

    requests: list[WorkloadRequest]
    source: str
    closed_loop_concurrency: int | None = None
    # rows of the source file left out, (reason, count): ``study create`` states them, so a
    # 400-row trace that yields 399 requests says why (traces.dropped_text)
    dropped: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.closed_loop_concurrency is not None:
            if self.closed_loop_concurrency < 1:
                raise ConfigError(
                    f"closed-loop concurrency must be >= 1, got {self.closed_loop_concurrency}"
                )
            if any(r.arrival is not None for r in self.requests):
                raise ValueError("a closed-loop workload has no arrival times (arrival=None)")
        elif any(r.arrival is None for r in self.requests):
            raise ValueError("arrival=None is only for closed-loop workloads")
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            # generated prompts are seeded by the id: duplicates would share content
            raise ValueError("request ids must be unique within a workload")

    def __len__(self) -> int:
        return len(self.requests)

    def arrivals(self) -> npt.NDArray[np.float64] | None:
        """Send times in seconds, or None for a closed loop."""
        if self.closed_loop_concurrency is not None:
            return None
        return np.array([r.arrival for r in self.requests], dtype=np.float64)

    def with_arrivals(self, times: Iterable[float], note: str = "") -> Workload:
        """The same requests sent at ``times`` (an open loop); see :mod:`.arrivals`."""
        t = np.asarray(list(times), dtype=np.float64)
        if t.shape != (len(self.requests),):
            raise ConfigError(f"arrivals: {t.size} times for {len(self.requests)} requests")
        if t.size and (not np.all(np.isfinite(t)) or t[0] < 0 or np.any(np.diff(t) < 0)):
            raise ConfigError("arrivals: times must be finite, >= 0 and non-decreasing")
        reqs = [replace(r, arrival=float(a)) for r, a in zip(self.requests, t, strict=True)]
        return Workload(reqs, self.source + (f"; {note}" if note else ""), dropped=self.dropped)

    def closed_loop(self, concurrency: int) -> Workload:
        """The same requests as a closed loop with ``concurrency`` in flight."""
        reqs = [replace(r, arrival=None) for r in self.requests]
        return Workload(
            reqs, self.source + f"; closed loop x{concurrency}", concurrency, self.dropped
        )

    def profile(self, peak_concurrency: int | None = None) -> WorkloadProfile:
        """Length and rate statistics plus the fingerprint; ``peak_concurrency`` as measured
        by a run (a closed loop's own concurrency is used when not given)."""
        return profile_of(self, peak_concurrency)

    def fingerprint(self) -> str:
        """sha256 of the canonical serialization (see :func:`.profile.fingerprint`)."""
        return fingerprint(self)
