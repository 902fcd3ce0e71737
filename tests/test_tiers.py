"""The test tiers (tests/support/tiers.py): every entry names a test that exists, and the
smoke tier has tests for every package of autotune, from modules that import it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.tiers import PACKAGES, SLOW, SMOKE, tier_marks

ROOT = Path(__file__).resolve().parents[1]


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def _autotune_imports(path: Path) -> set[str]:
    """The autotune packages a test file imports (lazy imports inside functions included)."""
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "autotune" and len(parts) > 1:
                out.add(parts[1])
    return out


ENTRIES = [e for entries in SMOKE.values() for e in entries] + list(SLOW)


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_tier_entry_names_a_test_that_exists(entry: str) -> None:
    file, _, rest = entry.partition("::")
    path = ROOT / file
    assert path.is_file() and path.name.startswith("test_"), entry
    name = rest.split("[")[0]
    assert not name or name in _tests_in(path), f"{entry}: no such test"


def test_smoke_touches_every_package_from_a_module_that_imports_it() -> None:
    assert set(SMOKE) == set(PACKAGES)
    for package in PACKAGES:
        assert (ROOT / "autotune" / package).is_dir() or (
            ROOT / "autotune" / f"{package}.py"
        ).is_file(), package
        files = {ROOT / e.partition("::")[0] for e in SMOKE[package]}
        assert any(package in _autotune_imports(f) for f in files), package


def test_tier_marks_match_files_tests_and_parametrizations() -> None:
    assert tier_marks("tests/test_engine.py::test_x[a-b]") == ["smoke"]
    assert tier_marks("tests/test_cli.py::test_help") == ["smoke"]
    assert tier_marks("tests/test_cli.py::test_help_more") == []
    assert tier_marks("tests/test_engine_more.py::test_x") == []
