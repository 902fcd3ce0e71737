"""What a server says about itself before a run: model, max_model_len, version, time scale.

Checked once per trial before load is sent, so an unreachable or misconfigured server
fails with one clear line instead of N failed request records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from autotune.errors import ServiceError

__all__ = ["ServerInfo", "probe_server"]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """``/v1/models`` and ``/version`` as read from one server."""

    base_url: str
    model_id: str  # the first served model (vLLM serves one)
    models: tuple[str, ...]
    max_model_len: int | None  # None when the server does not report it
    version: str | None  # None when /version is missing (non-vLLM servers)
    time_scale: float  # engine seconds per wall second; 1.0 for a real vLLM
    # Reported by autotune's simulated server only: token-id prompts must stay below it.
    vocab_size: int | None = None
    simulated: bool = False
    # vLLM's /v1/models "root": the model's path or hub name as the server loaded it
    root: str | None = None


async def _get_json(
    session: aiohttp.ClientSession, base: str, path: str, headers: dict[str, str], required: bool
) -> Any:
    async with session.get(base + path, headers=headers) as resp:
        text = await resp.text(errors="replace")
        if resp.status != 200:
            if not required:
                return None
            head = " ".join(text.split())[:200]
            raise ServiceError(f"server at {base} answered {resp.status} on {path}: {head}")
    try:
        return json.loads(text)
    except ValueError as exc:
        if not required:
            return None
        raise ServiceError(f"server at {base} sent invalid JSON on {path}") from exc


def _positive(value: Any, base: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ServiceError(f"server at {base} reports an invalid time_scale: {value!r}")
    return float(value)


async def probe_server(
    base_url: str, api_key: str | None = None, *, timeout: float = 10.0
) -> ServerInfo:
    """Read the server's model list and version; ServiceError when that is impossible."""
    base = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout), trust_env=False
        ) as session:
            models = await _get_json(session, base, "/v1/models", headers, required=True)
            version = await _get_json(session, base, "/version", headers, required=False)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ServiceError(f"cannot reach server at {base_url}: {reason}") from exc

    data = models.get("data") if isinstance(models, dict) else None
    entries = (
        [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
    )
    if not entries:
        raise ServiceError(f"server at {base_url} lists no model on /v1/models")
    first = entries[0]
    max_len = first.get("max_model_len")
    info = version if isinstance(version, dict) else {}
    return ServerInfo(
        base_url=base,
        model_id=str(first["id"]),
        models=tuple(str(m["id"]) for m in entries),
        max_model_len=max_len
        if isinstance(max_len, int) and not isinstance(max_len, bool)
        else None,
        version=str(info["version"]) if "version" in info else None,
        time_scale=_positive(info.get("time_scale", 1.0), base_url),
        vocab_size=info["vocab_size"] if isinstance(info.get("vocab_size"), int) else None,
        simulated=info.get("simulated") is True,
        root=str(first["root"]) if isinstance(first.get("root"), str) else None,
    )
