"""The ``config_field`` markers of the tests a session collected, shared between the
collection hook (tests/conftest.py) and the test that needs them (tests/test_config_fields.py).

The hook stores them in the session's stash before ``-m``/``-k`` deselect anything, and only
when the session collected the whole of ``tests/`` (pytest run with no path arguments, its
``testpaths``); otherwise the test collects the suite in a subprocess.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["ENV", "MARKS", "marks_of"]

# the whole-suite collection's markers: a list of {"test", "args", "n_args"} records
MARKS = pytest.StashKey[list[dict[str, Any]]]()
# a subprocess collecting the suite writes the same records to the file this names
ENV = "AUTOTUNE_CONFIG_FIELDS_OUT"


def marks_of(items: list[pytest.Item]) -> list[dict[str, Any]]:
    return [
        {"test": item.nodeid, "args": [str(a) for a in m.args], "n_args": len(m.args)}
        for item in items
        for m in item.iter_markers("config_field")
    ]
