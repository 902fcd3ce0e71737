"""autotune.workload hygiene: every module's public definitions exported, docstrings present."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = (
    "autotune.workload",
    "autotune.workload.core",
    "autotune.workload.arrivals",
    "autotune.workload.profile",
    "autotune.workload.sources",
    "autotune.workload.text",
    "autotune.workload.traces",
)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_complete_and_exists(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__
    assert [n for n in module.__all__ if not hasattr(module, n)] == []
    assert len(set(module.__all__)) == len(module.__all__)
    defined = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert defined - set(module.__all__) == set()


def test_package_reexports_the_submodules_public_api() -> None:
    package = importlib.import_module("autotune.workload")
    for name in ("core", "profile", "traces"):
        module = importlib.import_module(f"autotune.workload.{name}")
        internal = {"FINGERPRINT_VERSION", "profile_of"}  # reached through Workload methods
        assert set(module.__all__) - internal <= set(package.__all__)
