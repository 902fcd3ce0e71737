"""Shared test set-up: Hypothesis profiles, the service-availability fixture, the fault ledger.

Hypothesis deadlines are off in both profiles: CI and developer machines have two busy cores,
where wall-clock deadlines fail at random. CI also derandomizes, so a red run is reproducible.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import pytest
from hypothesis import settings
from support import config_marks
from support.services import in_ci, need_service
from support.tiers import tier_marks

# Fixtures several modules use (tests/support/): the fake OpenAI server, a real Prometheus.
pytest_plugins = ["support.fake_server", "support.prometheus"]

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=50)
settings.register_profile("dev", deadline=None, max_examples=30)


settings.load_profile("ci" if in_ci() else "dev")

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from execnet; the CLI reads $COLUMNS
# as a terminal width (autotune/cli/_app.py) and would wrap the lines tests match. A worker
# runs as a plain pytest run does: no terminal width.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.fixture
def require_service() -> Callable[[str, bool, str], None]:
    """``require_service(name, available, reason)``: :func:`need_service` as a fixture."""
    return need_service


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect: tiers and config fields see them all
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the smoke and slow tiers (tests/support/tiers.py)
        for name in tier_marks(item.nodeid):
            item.add_marker(name)
    # the config fields' markers (tests/support/config_marks.py): kept when this session
    # collected the whole suite, written out when a subprocess collects it for a test
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config.stash[config_marks.MARKS] = config_marks.marks_of(items)
    out = os.environ.get(config_marks.ENV)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(config_marks.marks_of(items), f)


# Under pytest-xdist the fault tests fill the ledger in a worker process: each worker hands
# its rows back through xdist's ``workeroutput`` and the controller, which prints the summary,
# collects them.
_LEDGER_KEY = "autotune_fault_ledger"


def pytest_sessionfinish(session: pytest.Session) -> None:
    import sys

    workeroutput = getattr(session.config, "workeroutput", None)
    ledger = sys.modules.get("support.ledger")
    if workeroutput is not None and ledger is not None and ledger.ROWS:
        workeroutput[_LEDGER_KEY] = [dataclasses.asdict(r) for r in ledger.ROWS]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_testnodedown(node: object, error: object) -> None:
    rows = getattr(node, "workeroutput", {}).get(_LEDGER_KEY)
    if rows:
        from support import ledger

        ledger.ROWS.extend(ledger.LedgerRow(**r) for r in rows)


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
