"""Shared test set-up: Hypothesis profiles, the service-availability fixture, the fault ledger.

Hypothesis deadlines are off in both profiles: CI and developer machines have two busy cores,
where wall-clock deadlines fail at random. CI also derandomizes, so a red run is reproducible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
from hypothesis import settings
from support.services import in_ci, need_service
from support.tiers import tier_marks

# Fixtures several modules use (tests/support/): the fake OpenAI server, a real Prometheus.
pytest_plugins = ["support.fake_server", "support.prometheus"]

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=50)
settings.register_profile("dev", deadline=None, max_examples=30)


settings.load_profile("ci" if in_ci() else "dev")


@pytest.fixture
def require_service() -> Callable[[str, bool, str], None]:
    """``require_service(name, available, reason)``: :func:`need_service` as a fixture."""
    return need_service


# ``tests/test_config_fields.py`` collects the suite in a subprocess with this variable set, to
# learn which config fields the collected tests mark with ``config_field("<dotted path>")``.
CONFIG_FIELDS_OUT = "AUTOTUNE_CONFIG_FIELDS_OUT"


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect: tiers and config fields see them all
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the smoke and slow tiers (tests/support/tiers.py)
        for name in tier_marks(item.nodeid):
            item.add_marker(name)
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
    """The fault ledger (tests/support/ledger.py), when the fault group ran."""
    import sys

    ledger = sys.modules.get("support.ledger")
    rows = getattr(ledger, "ROWS", None)
    if ledger is None or not rows:
        return
    terminalreporter.write_sep("=", "fault ledger (docs/faults.md#9-the-fault-ledger)")
    terminalreporter.write_line(ledger.format_table(rows))
    out = os.environ.get("AUTOTUNE_FAULT_LEDGER")
    if out:
        ledger.write_json(out, rows)
