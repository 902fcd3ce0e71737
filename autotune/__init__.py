"""autotune: an Optuna-driven autotuner for vLLM engine configs, with a simulated vLLM engine."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from autotune.errors import (
    AutotuneError,
    BusyError,
    ClientLimitError,
    ConfigError,
    DatabaseLostError,
    MissingExtraError,
    NotFoundError,
    ProfileError,
    ServiceError,
    SimStartupError,
    StorageError,
    WorkerStartupError,
)

__all__ = [
    "AutotuneError",
    "BusyError",
    "ClientLimitError",
    "ConfigError",
    "DatabaseLostError",
    "MissingExtraError",
    "NotFoundError",
    "ProfileError",
    "ServiceError",
    "SimStartupError",
    "StorageError",
    "WorkerStartupError",
    "__version__",
]

try:
    __version__ = version("autotune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.1.0"
