"""autotune's exception tree.

Every error autotune raises on purpose derives from :class:`AutotuneError`, so the
CLI catches exactly one type, prints one line and exits with the class's ``exit_code``::

    AutotuneError                   exit 1
     ├── ConfigError            1   bad configuration (file, field, line named in the message)
     ├── ProfileError           1   unknown hardware/model profile or unreadable config.json
     ├── WorkerStartupError     1   a worker (simulated or real vLLM) failed to start;
     │    │                         carries ``failure_class`` (see autotune.failures)
     │    └── SimStartupError   1   the simulated engine refused the engine args as vLLM does
     ├── StorageError           1   the database answered, but the operation failed
     ├── MissingExtraError      1   an optional feature's packages are not installed; the
     │                              message names the extra (``pip install 'autotune[report]'``)
     ├── ClientLimitError       1   the load generator's host could not drive a level's load,
     │                              twice (docs/loadgen.md#5-client-limited-levels)
     ├── NotFoundError          4   no such study, or no feasible trial to recommend
     ├── BusyError              6   another run holds the lock: a nightly job for the same
     │                              deployment, or another active scheduler
     └── ServiceError           5   a service is unreachable: a server, the database, Prometheus
          └── DatabaseLostError 5   the study database stayed unreachable past the outage
                                    tolerance of a run (docs/faults.md#4-database-outages)

Exit code 2 belongs to the argument parser's own usage errors, 3 to "a nightly job promoted
a new config", 130 to an interrupt.

Lower-layer errors (OSError, json.JSONDecodeError, pydantic.ValidationError, ...) are
translated once, at the boundary where they happen, with ``raise ... from``.
"""

from __future__ import annotations

from autotune.failures import FailureClass

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
]


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    #: the CLI's exit status for this class (docs/usage.md#3-errors-and-exit-codes)
    exit_code: int = 1


class ConfigError(AutotuneError):
    """Bad configuration: the message names the field, file and line where known.

    ``field`` is the path of the config field the error is about, as pydantic's ``loc``
    gives it (``("enqueue", 0, "max_model_len")``), when it is raised from a known field, so
    a caller can locate it in the file (docs/bad-input.md) without reading the message; None
    when the error is about no one field (a file, a flag, the document).
    """

    def __init__(self, message: str, *, field: tuple[str | int, ...] | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFoundError(AutotuneError):
    """What was asked for does not exist: a study, or a feasible trial to recommend."""

    exit_code = 4


class BusyError(AutotuneError):
    """Another process holds the lock this one needs: a nightly run of the same deployment,
    or the active scheduler (docs/nightly.md#7-locks)."""

    exit_code = 6


class ServiceError(AutotuneError):
    """A service autotune needs is unreachable: a server, the database or Prometheus."""

    exit_code = 5


class DatabaseLostError(ServiceError):
    """The study database stayed unreachable longer than a run's outage tolerance."""


class ProfileError(AutotuneError):
    """An unknown hardware or model profile, or a model config.json that cannot be used."""


class StorageError(AutotuneError):
    """The study database could not be read or written."""


class MissingExtraError(AutotuneError):
    """A command needs an optional extra that is not installed (the message names it)."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        super().__init__(
            f"{what} needs {module}, which is not installed: pip install 'autotune[{extra}]'"
        )
        self.extra = extra


class ClientLimitError(AutotuneError):
    """The host running the load generator could not drive a level's load, on the level and
    on its re-run: the figures would measure the client, not the server. Not a
    :class:`ServiceError`: the server answered; the fix is on this side (a lower load, a
    bigger host)."""


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
