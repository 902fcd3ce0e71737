"""Every stored key autotune writes is read only by the module that owns it.

A stored level's own keys (beside ``vllm bench serve``'s) and every Optuna study and trial
attribute key have one owner module, which writes them and offers the one reader
(docs/architecture.md#4-one-owner-per-stored-key). This test builds the set of owned keys from
the owners themselves (their ``*_KEY`` constants) plus the level keys named below, then scans
``autotune/`` and ``benchmarks/`` with ``ast`` for a read of one of them by its string
anywhere else: ``x["key"]``, ``x.get("key")``, ``x.pop("key")`` or ``"key" in x``. The checker
is tried first on planted in-memory sources.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a stored level's metrics: the keys autotune adds to the bench summary, and their owners
_OUTCOME = "autotune/tuning/measure/outcome.py"
_STOP = "autotune/loadgen/stopped.py"
_CLIENT = "autotune/loadgen/client_limit.py"
_VERDICT = "autotune/loadgen/verdict_point.py"
LEVEL_KEYS: dict[str, tuple[str, ...]] = {
    "early_stop": (_STOP,),
    "verdict_at": (_VERDICT,),
    "client_limit": (_CLIENT,),
    # also two fields of the stored stop itself (the dict under "early_stop"), owned there,
    # and one of the observed verdict point's (the dict under "verdict_at")
    "replay_s": (_OUTCOME, _STOP),
    "planned_requests": (_OUTCOME, _STOP, _VERDICT),
    "partial": (_OUTCOME,),
    "sent_requests": (_OUTCOME,),
    "last_sent_at_s": (_OUTCOME,),
    "worker_death": (_OUTCOME,),
    "sample_requests": ("autotune/workload/sustain.py",),  # a looped level's sample size
}
# reads of the same word in a different record, which no owner writes: (path, key) -> why
OTHER_RECORDS = {
    ("autotune/report/tables.py", "stage"): "a row of the trials table (report/tables.py)",
    ("autotune/report/tables.py", "failure_class"): "a row of the trials table",
    ("autotune/report/tables.py", "capacity_scale"): "a row of the trials table",
    ("benchmarks/tuning_quality.py", "replay_s"): "the benchmark's own per-study record",
}
# the Optuna attribute keys' owners: every module-level string constant named ``*_KEY``
ATTR_OWNERS = ("autotune/tuning/attrs.py", "autotune/tuning/study_attrs.py")
_READ_METHODS = frozenset({"get", "pop", "setdefault"})


def key_constants(source: str) -> set[str]:
    """The values of a module's top-level ``NAME_KEY = "..."`` constants."""
    out = set()
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Name) and t.id.endswith("_KEY") for t in node.targets)
        ):
            out.add(node.value.value)
    return out


def key_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every string read by key in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _READ_METHODS
            and node.args
        ):
            key = node.args[0]
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, key.value))
    return found


def foreign_reads(
    sources: dict[str, str],
    owners: dict[str, tuple[str, ...]],
    other_records: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """``path:line: "key" ...`` for each read of an owned key outside its owners (and not
    one of ``other_records``)."""
    out = []
    for path, source in sorted(sources.items()):
        for line, key in key_reads(source):
            owner = owners.get(key)
            if owner and path not in owner and (path, key) not in (other_records or {}):
                out.append(f'{path}:{line}: "{key}" is read here; its owner is {owner[0]}')
    return out


def repository_owners() -> dict[str, tuple[str, ...]]:
    owners = dict(LEVEL_KEYS)
    for path in ATTR_OWNERS:
        for key in key_constants((ROOT / path).read_text()):
            owners[key] = (path,)
    return owners


def repository_sources() -> dict[str, str]:
    files = [*(ROOT / "autotune").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    return {str(p.relative_to(ROOT)): p.read_text() for p in files}


def test_the_checker_finds_each_kind_of_read() -> None:
    owners = {"early_stop": ("a.py",), "autotune.bounds": ("a.py",)}
    planted = {
        "a.py": 'x = m["early_stop"]\n',  # the owner may
        "b.py": (
            'a = m["early_stop"]\n'
            'b = m.get("early_stop")\n'
            'c = "early_stop" in m\n'
            'd = s.user_attrs.pop("autotune.bounds", None)\n'
            'e = {"early_stop": 1}\n'  # writing a dict is not reading a key
            'f = m["completed"]\n'  # not an owned key
        ),
    }
    got = foreign_reads(planted, owners)
    assert [g.split(":")[1] for g in got] == ["1", "2", "3", "4"], got
    assert len(foreign_reads(planted, owners, {("b.py", "early_stop"): "why"})) == 1


def test_key_constants_are_read_from_the_owner() -> None:
    src = 'BOUNDS_KEY = "autotune.bounds"\n_X = "y"\nOTHER = "z"\n'
    assert key_constants(src) == {"autotune.bounds"}


def test_the_owners_define_their_keys() -> None:
    owners = repository_owners()
    for path in ATTR_OWNERS:
        assert (path,) in owners.values(), f"{path} defines no *_KEY constant"
    sources = repository_sources()
    for key, paths in LEVEL_KEYS.items():
        for path in paths:
            assert f'"{key}"' in sources[path], f"{path} does not write {key!r}"
    for path, key in OTHER_RECORDS:
        assert key in owners and f'"{key}"' in sources[path], (path, key)


@pytest.mark.parametrize("where", ["autotune", "benchmarks"])
def test_no_owned_key_is_read_outside_its_owner(where: str) -> None:
    sources = {p: s for p, s in repository_sources().items() if p.startswith(where + "/")}
    assert foreign_reads(sources, repository_owners(), OTHER_RECORDS) == []


OPTUNA_IDS = "autotune/store/optuna_ids.py"  # the one reader of Optuna's private ids


def private_id_reads(sources: dict[str, str]) -> list[str]:
    """``path:line`` of each ``x._trial_id`` / ``x._study_id`` outside :data:`OPTUNA_IDS`."""
    return [
        f"{path}:{node.lineno}"
        for path, source in sorted(sources.items())
        if path != OPTUNA_IDS
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in ("_trial_id", "_study_id")
    ]


def test_optunas_private_ids_are_read_in_one_module() -> None:
    planted = {OPTUNA_IDS: "a = t._trial_id\n", "b.py": "x = 1\nb = s._study_id\n"}
    assert private_id_reads(planted) == ["b.py:2"]
    assert private_id_reads(repository_sources()) == []
