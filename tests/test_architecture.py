"""The layers of docs/architecture.md hold: the import graph of ``autotune/``, built from the
source with ``ast``, has no arrow the document's table does not allow.

The table is read from docs/architecture.md (its one owner). The checker is tested first on
planted in-memory trees, so a violation is shown to be reported before the repository scan is
trusted to find none.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = "autotune"


@dataclass(frozen=True)
class Layers:
    """Each unit's layer and the units with a front door (docs/architecture.md#1-the-layers)."""

    layer: dict[str, int]
    doors: frozenset[str]


def parse_layers(text: str) -> Layers:
    """The table between the ``<!-- layers`` and ``<!-- /layers -->`` markers."""
    m = re.search(r"<!-- layers\b.*?-->(.*?)<!-- /layers -->", text, re.S)
    assert m, "docs/architecture.md has no layers table"
    layer: dict[str, int] = {}
    doors: set[str] = set()
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        units = re.findall(r"`([a-z_]+)`", cells[1])
        assert units, f"a layer without units: {row!r}"
        for u in units:
            assert u not in layer, f"{u} is in two layers"
            layer[u] = int(cells[0])
            if cells[2]:
                doors.add(u)
    return Layers(layer, frozenset(doors))


@dataclass(frozen=True)
class Arrow:
    """One import: ``source`` (a module) imports ``target`` (a module), ``name`` from it
    when the import names something that is not a module."""

    path: str
    line: int
    source: str
    target: str
    name: str | None


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (packages by their name)."""
    out: dict[str, Path] = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def import_graph(root: Path) -> list[Arrow]:
    """Every import of a module of the package, at any depth of any module under ``root``."""
    modules = _modules(root)
    arrows: list[Arrow] = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text("utf-8"), rel)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE:
                        arrows.append(Arrow(rel, node.lineno, mod, alias.name, None))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base_mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_mod = node.module or ""
                if base_mod.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    sub = f"{base_mod}.{alias.name}"
                    if sub in modules:  # ``from autotune.sim import engine``: a module
                        arrows.append(Arrow(rel, node.lineno, mod, sub, None))
                    else:
                        arrows.append(Arrow(rel, node.lineno, mod, base_mod, alias.name))
    return arrows


def unit_of(module: str) -> str:
    """``autotune.sim.engine`` -> ``sim``; ``autotune.errors`` -> ``errors``; the package's
    own ``__init__`` -> ``autotune``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(arrows: list[Arrow], layers: Layers) -> list[str]:
    """One line per arrow the layers forbid (docs/architecture.md#2-the-rules-the-test-checks)."""
    out: list[str] = []
    for a in arrows:
        src, dst = unit_of(a.source), unit_of(a.target)
        if src == dst:
            continue
        where = f"{a.path}:{a.line}: {a.source} imports {a.target}"
        if a.name is not None:
            where += f".{a.name}"
        ls, ld = layers.layer.get(src), layers.layer.get(dst)
        if ls is None or ld is None:
            missing = src if ls is None else dst
            out.append(f"{where}: {missing} has no layer in docs/architecture.md")
            continue
        if ld >= ls:
            out.append(
                f"{where}: {src} (layer {ls}) may import only from layers below it, "
                f"not {dst} (layer {ld})"
            )
        if dst in layers.doors and a.target != f"{PACKAGE}.{dst}":
            out.append(f"{where}: other units import {dst} only through autotune.{dst}")
        inner = a.target.split(".")[1:]
        if any(_private(p) for p in inner) or (a.name is not None and _private(a.name)):
            out.append(f"{where}: a private name of {dst}")
    return out


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, "utf-8")
    return tmp_path


LAYERS = parse_layers(DOC.read_text("utf-8"))
_BASE = {
    "autotune/__init__.py": "",
    "autotune/errors.py": "",
    "autotune/config.py": "_Model = object\n",
    "autotune/report/__init__.py": "",
    "autotune/report/dashboard.py": "",
    "autotune/sim/__init__.py": "from autotune.sim.engine import Engine\n",
    "autotune/sim/engine.py": "class Engine: ...\n",
    "autotune/workload/__init__.py": "",
    "autotune/tuning/__init__.py": "",
    "autotune/nightly/__init__.py": "",
}


def _check(tmp_path: Path, planted: dict[str, str]) -> list[str]:
    return violations(import_graph(_tree(tmp_path, {**_BASE, **planted})), LAYERS)


def test_the_table_reads_as_the_page_draws_it() -> None:
    assert LAYERS.layer["failures"] == 0 and LAYERS.layer["cli"] == max(LAYERS.layer.values())
    assert LAYERS.doors == {"sim"}
    # the page's specific rules follow from the order
    for low in ("workload", "loadgen", "telemetry"):
        assert LAYERS.layer[low] < LAYERS.layer["sim"]
    assert LAYERS.layer["sim"] < LAYERS.layer["workers"]
    assert LAYERS.layer["tuning"] < LAYERS.layer["report"]


def test_the_planted_tree_without_a_plant_passes(tmp_path: Path) -> None:
    assert _check(tmp_path, {}) == []


def test_a_report_import_in_tuning_fails(tmp_path: Path) -> None:
    found = _check(tmp_path, {"autotune/tuning/run/controller.py": "import autotune.report\n"})
    assert found == [
        "autotune/tuning/run/controller.py:1: autotune.tuning.run.controller imports "
        "autotune.report: tuning (layer 8) may import only from layers below it, "
        "not report (layer 10)"
    ]


def test_an_engine_import_in_workload_fails_twice(tmp_path: Path) -> None:
    # upwards, and around the simulator's front door
    found = _check(
        tmp_path, {"autotune/workload/core.py": "from autotune.sim.engine import Engine\n"}
    )
    assert found == [
        "autotune/workload/core.py:1: autotune.workload.core imports autotune.sim.engine.Engine:"
        " workload (layer 4) may import only from layers below it, not sim (layer 6)",
        "autotune/workload/core.py:1: autotune.workload.core imports autotune.sim.engine.Engine:"
        " other units import sim only through autotune.sim",
    ]


def test_lazy_and_relative_imports_count(tmp_path: Path) -> None:
    found = _check(
        tmp_path,
        {
            "autotune/workload/core.py": "def f():\n    from ..sim import Engine\n",
            "autotune/workload/more.py": "from .. import report\n",
        },
    )
    assert [f.split(": ", 1)[0] for f in found] == [
        "autotune/workload/core.py:2",
        "autotune/workload/more.py:1",
    ]
    assert "imports autotune.sim.Engine" in found[0] and "imports autotune.report:" in found[1]


def test_a_submodule_of_a_front_door_unit_is_refused_even_from_above(tmp_path: Path) -> None:
    ok = "from autotune.sim import Engine\n"
    around = "from autotune.sim import engine\n"
    assert _check(tmp_path, {"autotune/tuning/a.py": ok}) == []
    assert _check(tmp_path, {"autotune/tuning/a.py": around}) == [
        "autotune/tuning/a.py:1: autotune.tuning.a imports autotune.sim.engine: "
        "other units import sim only through autotune.sim"
    ]


def test_private_names_and_modules_of_another_unit_are_refused(tmp_path: Path) -> None:
    found = _check(
        tmp_path,
        {
            "autotune/nightly/config.py": "from autotune.config import _Model\n",
            "autotune/report/_private.py": "",
            "autotune/nightly/job.py": "from autotune.report import _private\n",
            "autotune/nightly/ok.py": "from autotune import __version__\n",
            "autotune/report/own.py": "from autotune.report._private import x\n",
        },
    )
    assert found == [
        "autotune/nightly/config.py:1: autotune.nightly.config imports autotune.config._Model: "
        "a private name of config",
        "autotune/nightly/job.py:1: autotune.nightly.job imports autotune.report._private: "
        "a private name of report",
    ]


def test_a_unit_without_a_layer_is_reported(tmp_path: Path) -> None:
    found = _check(tmp_path, {"autotune/newpkg/__init__.py": "from autotune import errors\n"})
    assert found == [
        "autotune/newpkg/__init__.py:1: autotune.newpkg imports autotune.errors: "
        "newpkg has no layer in docs/architecture.md"
    ]


def test_every_unit_of_the_package_has_a_layer() -> None:
    units = {unit_of(m) for m in _modules(ROOT)}
    assert units - set(LAYERS.layer) == set()
    assert set(LAYERS.layer) - units == set(), "the table names a unit that does not exist"


@functools.cache
def _package_graph() -> tuple[Arrow, ...]:
    return tuple(import_graph(ROOT))


def test_the_package_keeps_its_layers() -> None:
    arrows = list(_package_graph())
    assert len(arrows) > 500  # the scan saw the package
    assert violations(arrows, LAYERS) == []


@pytest.mark.parametrize(
    ("low", "high"),
    [("workload", "sim"), ("loadgen", "sim"), ("telemetry", "sim"), ("sim", "workers")],
)
def test_the_named_arrows_are_absent(low: str, high: str) -> None:
    assert not [
        a for a in import_graph(ROOT) if unit_of(a.source) == low and unit_of(a.target) == high
    ]


# -- the rooms: size and names (docs/architecture.md#5-modules) -------------------------------
MAX_LINES = 400
# base names two modules may share: the package files, and names fixed by a tool or that say
# the same job on two layers
SHARED_NAMES = {
    "__init__.py": "a package's own module",
    "__main__.py": "`python -m` of a package",
    "env.py": "Alembic's fixed name for store/migrations/env.py",
    "bench.py": "cli/bench.py is the `autotune bench` command of loadgen/bench.py",
}


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for each module of ``autotune/`` over ``limit`` lines."""
    out = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def shared_names(root: Path) -> dict[str, list[str]]:
    """Module base names that more than one module of ``autotune/`` has, but the allowed."""
    seen: dict[str, list[str]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(root)))
    return {k: v for k, v in seen.items() if len(v) > 1 and k not in SHARED_NAMES}


def test_the_size_and_name_checks_see_a_planted_tree(tmp_path: Path) -> None:
    a, b = f"{PACKAGE}/a/metrics.py", f"{PACKAGE}/b/metrics.py"
    files = {a: "x = 1\n" * (MAX_LINES + 1), b: "x = 1\n" * MAX_LINES}
    root = _tree(tmp_path, {**files, f"{PACKAGE}/b/env.py": "", f"{PACKAGE}/c/env.py": ""})
    assert long_modules(root) == [f"{a}: {MAX_LINES + 1} lines"]
    assert shared_names(root) == {"metrics.py": [a, b]}


def test_no_module_is_over_the_limit() -> None:
    assert long_modules(ROOT) == []


def test_no_two_modules_share_a_name_for_different_jobs() -> None:
    assert shared_names(ROOT) == {}
    for name in SHARED_NAMES:
        assert len(list((ROOT / PACKAGE).rglob(name))) > 1, f"{name} is no longer shared"
