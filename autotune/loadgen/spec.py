"""What the load generator needs to know about one request.

The workload package builds frozen ``WorkloadRequest`` records; the load generator codes
against this Protocol instead of importing them, so the two packages stay decoupled and any
object with these read-only attributes (a test double, a replayed trace row) can be sent.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["RequestSpec"]


@runtime_checkable
class RequestSpec(Protocol):
    """One request to send. Properties, not attributes, so frozen dataclasses match."""

    @property
    def request_id(self) -> str:
        """Unique within a run; copied into the record."""
        ...

    @property
    def prompt_len(self) -> int:
        """Prompt length in tokens as the workload planned it (the server's count may differ)."""
        ...

    @property
    def output_len(self) -> int:
        """Output tokens to ask for (``max_tokens``; exact with ``ignore_eos``)."""
        ...

    @property
    def prompt_token_ids(self) -> tuple[int, ...] | None:
        """Pre-tokenized prompt (completions only); preferred over text when both exist."""
        ...

    @property
    def prompt_text(self) -> str | None:
        """Prompt text; the only form the chat endpoint accepts."""
        ...

    @property
    def arrival(self) -> float | None:
        """Send time in engine seconds from the start of the run; None = closed loop."""
        ...
