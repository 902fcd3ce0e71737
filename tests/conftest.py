"""Shared test set-up: Hypothesis profiles and the service-availability rule.

Hypothesis deadlines are off in both profiles: CI and developer machines have two busy cores,
where wall-clock deadlines fail at random. CI also derandomizes, so a red run is reproducible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=50)
settings.register_profile("dev", deadline=None, max_examples=30)


def in_ci() -> bool:
    """True when running under CI (``.ci/run`` exports ``CI=true``)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


settings.load_profile("ci" if in_ci() else "dev")


def need_service(name: str, available: bool, reason: str) -> None:
    """Gate a test on an external service (PostgreSQL, Prometheus, ...).

    In CI a missing service is a broken CI set-up, not a reason to skip: ``.ci/run`` starts
    every service the tests need, so the test fails and says so. Elsewhere it is skipped
    with a one-line reason, so a developer without the service still gets a green suite.
    """
    if available:
        return
    if in_ci():
        pytest.fail(f"{name} is required with CI=true but unavailable: {reason}", pytrace=False)
    pytest.skip(f"{name} unavailable: {reason}")


@pytest.fixture
def require_service() -> Callable[[str, bool, str], None]:
    """``require_service(name, available, reason)``: :func:`need_service` as a fixture."""
    return need_service


# ``tests/test_config_fields.py`` collects the suite in a subprocess with this variable set, to
# learn which config fields the collected tests mark with ``config_field("<dotted path>")``.
CONFIG_FIELDS_OUT = "AUTOTUNE_CONFIG_FIELDS_OUT"


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect: every collected test counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    out = os.environ.get(CONFIG_FIELDS_OUT)
    if not out:
        return
    marks = [
        {"test": item.nodeid, "args": [str(a) for a in m.args], "n_args": len(m.args)}
        for item in items
        for m in item.iter_markers("config_field")
    ]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(marks, f)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault ledger (tests/ledger.py), when the fault group ran."""
    import sys

    ledger = sys.modules.get("ledger")
    rows = getattr(ledger, "ROWS", None)
    if ledger is None or not rows:
        return
    terminalreporter.write_sep("=", "fault ledger (docs/faults.md#9-the-fault-ledger)")
    terminalreporter.write_line(ledger.format_table(rows))
    out = os.environ.get("AUTOTUNE_FAULT_LEDGER")
    if out:
        ledger.write_json(out, rows)
