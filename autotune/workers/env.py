"""The environment a worker process receives: an allow-list, not the controller's whole one.

The controller's environment holds the study database URL (with its password), cloud keys and
API tokens; a ``vllm serve`` child needs none of them. A worker gets only:

- the basics a process needs: ``PATH``, ``HOME``, ``LANG``, ``LC_*``, ``TZ``, ``TMPDIR``;
- the families vLLM and its libraries read: :data:`ALLOWED_PREFIXES`;
- ``worker.env`` (set explicitly in the study config) and the names listed in
  ``worker.env_passthrough`` (copied from the controller's environment when set there).

The caller then overlays its own per-trial values (``TMPDIR``, cache folders,
``CUDA_VISIBLE_DEVICES``), which always win.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "ALLOWED_NAMES",
    "ALLOWED_PREFIXES",
    "ENV_NAME",
    "allowed",
    "worker_environment",
]

ALLOWED_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD"}
)
# ``PYTHON`` without an underscore: PYTHONPATH, PYTHONHASHSEED, PYTHONUNBUFFERED, ...
ALLOWED_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "VLLM_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TRITON_",
    "OMP_",
    "KMP_",
    "XDG_",
    "PYTHON",
)
# A POSIX environment variable name; ``worker.env_passthrough`` may end a name with ``*``.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def allowed(name: str) -> bool:
    """Whether the allow-list passes ``name`` on from the controller's environment."""
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def worker_environment(
    inherited: Mapping[str, str],
    *,
    passthrough: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed part of ``inherited``, plus the ``passthrough`` names found there
    (exact names, or patterns such as ``MY_*``), then ``extra`` on top."""
    patterns = tuple(passthrough)
    env = {
        k: v
        for k, v in inherited.items()
        if allowed(k) or any(fnmatch.fnmatchcase(k, p) for p in patterns)
    }
    env.update(extra or {})
    return env
