"""autotune's exception tree.

Every error autotune raises on purpose derives from :class:`AutotuneError`, so the
CLI catches exactly one type, prints one line and exits non-zero::

    AutotuneError
     ├── ConfigError            bad user input (file, field, line named in the message)
     ├── ProfileError           unknown hardware/model profile or unreadable config.json
     ├── WorkerStartupError     a worker (simulated or real vLLM) failed to start;
     │    │                     carries ``failure_class`` (see autotune.failures)
     │    └── SimStartupError   the simulated engine refused the engine args the way vLLM does
     └── StorageError           database problems

Lower-layer errors (OSError, json.JSONDecodeError, pydantic.ValidationError, ...) are
translated once, at the boundary where they happen, with ``raise ... from``.
"""

from __future__ import annotations

from autotune.failures import FailureClass

__all__ = [
    "AutotuneError",
    "ConfigError",
    "ProfileError",
    "SimStartupError",
    "StorageError",
    "WorkerStartupError",
]


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""


class ConfigError(AutotuneError):
    """Bad user input: the message names the field, file and line where known."""


class ProfileError(AutotuneError):
    """An unknown hardware or model profile, or a model config.json that cannot be used."""


class StorageError(AutotuneError):
    """The study database could not be read or written."""


class WorkerStartupError(AutotuneError):
    """A worker failed to start. ``failure_class`` says why, in the shared vocabulary."""

    def __init__(self, message: str, failure_class: FailureClass) -> None:
        super().__init__(message)
        self.failure_class = failure_class


class SimStartupError(WorkerStartupError):
    """The simulated engine rejected its engine args exactly where vLLM would.

    ``message`` is vLLM's own text (0.32 wording, GPU flavour); ``log_lines`` is what a
    real ``vllm serve`` would print for it (pydantic wrapper, EngineCore traceback tail),
    so log classifiers see the same text from simulated and real workers.
    """

    def __init__(
        self, message: str, failure_class: FailureClass, log_lines: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, failure_class)
        self.log_lines = log_lines or (message,)
