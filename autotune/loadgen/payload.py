"""The request body and URL for OpenAI-compatible endpoints, and how requests are sent.

Kept apart from the streaming client so the runner and tests can build and inspect a
payload without any networking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotune.loadgen.spec import RequestSpec

__all__ = [
    "DEFAULT_STALL_TIMEOUT",
    "Endpoint",
    "RequestOptions",
    "build_payload",
    "endpoint_url",
]

Endpoint = Literal["completions", "chat"]
_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Waiting for the first token counts as a stall too (no bytes arrive while vLLM queues a
# request), so the default must exceed any TTFT worth measuring.
DEFAULT_STALL_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """How to send requests; timeouts are wall-clock seconds (they guard the client)."""

    model: str
    endpoint: Endpoint = "completions"
    api_key: str | None = None
    timeout: float | None = None  # whole request; None = no limit
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT  # longest silence, first byte included
    temperature: float = 0.0
    ignore_eos: bool = True  # fixed output lengths, as vLLM forces for synthetic datasets
    extra_body: Mapping[str, Any] | None = None


def endpoint_url(base_url: str, endpoint: Endpoint) -> str:
    """``http://host:port`` (or ``.../v1``) + the endpoint's path."""
    base = base_url.rstrip("/")
    base = base.removesuffix("/v1")
    return base + _PATHS[endpoint]


def build_payload(spec: RequestSpec, options: RequestOptions) -> dict[str, Any]:
    """The JSON body; ValueError when ``spec`` has no prompt the endpoint can take."""
    body: dict[str, Any] = {
        "model": options.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": options.temperature,
    }
    if options.endpoint == "chat":
        if spec.prompt_text is None:
            raise ValueError(f"request {spec.request_id}: the chat endpoint needs prompt_text")
        body["messages"] = [{"role": "user", "content": spec.prompt_text}]
        # vLLM prefers max_completion_tokens and still reads max_tokens; send both so
        # servers that know only one of them get the limit.
        body["max_completion_tokens"] = spec.output_len
        body["max_tokens"] = spec.output_len
    else:
        if spec.prompt_token_ids is not None:  # exact length, no tokenizer round trip
            body["prompt"] = list(spec.prompt_token_ids)
        elif spec.prompt_text is not None:
            body["prompt"] = spec.prompt_text
        else:
            raise ValueError(f"request {spec.request_id}: no prompt_text or prompt_token_ids")
        body["max_tokens"] = spec.output_len
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.extra_body:
        body.update(options.extra_body)
    return body
