"""What a study posted over HTTP may set (docs/nightly.md#9-the-service-api).

The API must not become remote code execution: a posted study may not name the program a
worker runs (``worker.vllm_executable``), its environment (``worker.env``,
``worker.env_passthrough``), the database (``storage``), or any path outside the server's
studies folder; nor use ``${VAR}``, which would read the server's environment. The server's
own settings fill those in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["FORBIDDEN_FIELDS", "PATH_FIELDS", "PolicyError", "ServerWorker", "apply_policy"]

FORBIDDEN_FIELDS = (
    ("worker", "vllm_executable"),
    ("worker", "env"),
    ("worker", "env_passthrough"),
    ("storage",),
)
# fields holding a path: relative ones are resolved in the studies folder, and none may
# leave it
PATH_FIELDS = (
    ("workload", "path"),
    ("model", "config_json"),
    ("worker", "workdir"),
    ("telemetry", "sd_file"),
)


class PolicyError(Exception):
    """A posted study sets what only the server's config may (HTTP 403)."""


@dataclass(frozen=True)
class ServerWorker:
    """What the server's own config decides for every posted study."""

    vllm_executable: tuple[str, ...] = ("vllm",)
    env: Mapping[str, str] = field(default_factory=dict)


def _get(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _inside(value: str, folder: Path, where: str) -> str:
    p = Path(value).expanduser()
    full = (p if p.is_absolute() else folder / p).resolve()
    if not full.is_relative_to(folder.resolve()):
        raise PolicyError(f"{where}: {value!r} lies outside the server's studies folder")
    return str(full)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def apply_policy(text: str, folder: Path, worker: ServerWorker) -> dict[str, Any]:
    """The posted document with the server's settings applied; PolicyError for a field the
    API may not set. ``text`` has already passed :func:`autotune.config.parse_config`."""
    if "${" in text:
        raise PolicyError("${VAR} expansion is not allowed in a posted study")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    for path in FORBIDDEN_FIELDS:
        if _get(data, path) is not None:
            raise PolicyError(f"{'.'.join(path)}: set by the server's config, not by the API")
    for path in PATH_FIELDS:
        value = _get(data, path)
        if value is not None:
            data[path[0]][path[1]] = _inside(str(value), folder, ".".join(path))
    name = str(_get(data, ("model", "name")) or "")
    if _looks_like_path(name):
        data["model"]["name"] = _inside(name, folder, "model.name")
    w = data.setdefault("worker", {})
    w["vllm_executable"] = list(worker.vllm_executable)
    w["env"] = dict(worker.env)
    w.setdefault("workdir", str(folder / ".autotune" / "workers"))
    return data
