"""Package hygiene: public names, the error tree, the failure vocabulary, test helpers."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
from support.services import need_service

import autotune
from autotune import errors
from autotune.errors import AutotuneError, SimStartupError, WorkerStartupError
from autotune.failures import FailureClass


def _modules() -> tuple[str, ...]:
    """Every module of the package (``__main__`` aside): each must declare ``__all__``."""
    import pkgutil

    names = ["autotune"]
    for info in pkgutil.walk_packages(autotune.__path__, "autotune."):
        last = info.name.rsplit(".", 1)[-1]
        if last != "__main__" and not last.startswith("_") and ".migrations" not in info.name:
            names.append(info.name)
    return tuple(sorted(names))


PUBLIC_MODULES = _modules()


def test_every_module_declares_all() -> None:
    missing = [n for n in PUBLIC_MODULES if not hasattr(importlib.import_module(n), "__all__")]
    assert missing == []


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []
    assert len(set(module.__all__)) == len(module.__all__), "duplicates in __all__"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_definitions_are_in_all(name: str) -> None:
    # httpx's rule: every public class or function *defined* in the module is exported.
    module = importlib.import_module(name)
    defined = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert defined - set(module.__all__) == set()


def test_top_level_reexports_every_error() -> None:
    for n in errors.__all__:
        assert getattr(autotune, n) is getattr(errors, n)
        assert n in autotune.__all__


def test_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", autotune.__version__)


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_an_autotune_error(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, AutotuneError)
    assert issubclass(cls, Exception)


def test_worker_startup_error_carries_failure_class() -> None:
    exc = WorkerStartupError("port taken", FailureClass.PORT_IN_USE)
    assert exc.failure_class is FailureClass.PORT_IN_USE
    assert str(exc) == "port taken"


def test_sim_startup_error_is_a_worker_startup_error() -> None:
    exc = SimStartupError("No available memory for the cache blocks.", FailureClass.NO_KV_MEMORY)
    assert isinstance(exc, WorkerStartupError)
    assert exc.failure_class is FailureClass.NO_KV_MEMORY
    assert exc.log_lines == ("No available memory for the cache blocks.",)


def test_failure_classes_are_exactly_the_fourteen() -> None:
    assert [c.value for c in FailureClass] == [
        "FREE_MEMORY",
        "NO_KV_MEMORY",
        "KV_TOO_SMALL",
        "MNBT_LT_MAXLEN",
        "MNBT_LT_MNS",
        "MAXLEN_GT_MODEL",
        "CONFIG_INVALID",
        "RUNTIME_OOM",
        "ENGINE_DEAD",
        "STARTUP_TIMEOUT",
        "PORT_IN_USE",
        "KILLED",
        "HUNG",
        "UNKNOWN",
    ]
    assert all(c.name == c.value for c in FailureClass)


# -- need_service (tests/support/services.py) ------------------------------------------


def test_need_service_passes_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    need_service("PostgreSQL", True, "unused")


def test_need_service_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"PostgreSQL.*CI=true.*no server"):
        need_service("PostgreSQL", False, "no server on 127.0.0.1:5432")


def test_need_service_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Prometheus unavailable: no binary"):
        need_service("Prometheus", False, "no binary")
