"""What a database outage prints (docs/faults.md#4-database-outages): one line when it ends,
ridden out or past the tolerance, never more; the details behind it at debug level, in the
file of ``--log-file``. The end-to-end check with a live worker and a real PostgreSQL is
the outage test of tests/test_faults.py."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from autotune.errors import DatabaseLostError, StorageError
from autotune.log import setup_logging
from autotune.store.resilience import Resilience, secondary_failure

URL = "postgresql+psycopg://u:secret@db.example/x"


def _down(times: int) -> object:
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise psycopg.OperationalError("connection refused")
        return "ok"

    return fn


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_ridden_out_outage_is_one_warning_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    res = Resilience(URL, tolerance_s=5.0)
    with caplog.at_level(logging.DEBUG, logger="autotune"):
        assert res.call("reading", _down(2)) == "ok"  # type: ignore[arg-type]
    (line,) = _warnings(caplog)
    assert line.startswith("the study database at postgresql+psycopg://u:***@db.example/x")
    assert line.endswith("; ridden out") and "secret" not in line
    # the start of the outage is there at info level, for --log-level INFO and the log file
    assert any(
        r.levelno == logging.INFO and "lost the study database" in r.getMessage()
        for r in caplog.records
    )


def test_an_outage_past_the_tolerance_logs_no_warning_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    res = Resilience(URL, tolerance_s=0.2)
    with caplog.at_level(logging.DEBUG, logger="autotune"), pytest.raises(DatabaseLostError):
        res.call("updating trial id 2", _down(1000))  # type: ignore[arg-type]
    assert _warnings(caplog) == []  # the run's error is the one line


def test_a_secondary_failure_is_quiet_when_the_database_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("autotune.test")
    lost = DatabaseLostError("lost the study database at x for 6 s")
    other = StorageError("recording a stopped worker failed: disk I/O error\nsecond line")
    with caplog.at_level(logging.DEBUG, logger="autotune"):
        secondary_failure(log, "recording that worker group 7 is gone", lost)
        secondary_failure(log, "recording that worker group 8 is gone", other)
    assert _warnings(caplog) == [
        "recording that worker group 8 is gone: recording a stopped worker failed: disk I/O error"
    ]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert [r.exc_info[1] for r in debug if r.exc_info] == [lost, other]


def test_log_file_takes_autotunes_debug_records_and_stderr_keeps_its_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "autotune.log"
    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        setup_logging("WARNING", file=str(path))
        logging.getLogger("autotune.x").debug("the details")
        logging.getLogger("autotune.x").warning("the line")
        logging.getLogger("sqlalchemy.engine").info("SELECT 1")  # a library's chatter
        for h in root.handlers:
            h.flush()
    finally:
        setup_logging("WARNING")  # our handlers replaced (the file closed)
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    err = capsys.readouterr().err
    assert "the line" in err and "the details" not in err
    text = path.read_text()
    assert "DEBUG autotune.x: the details" in text and "WARNING autotune.x: the line" in text
    assert "SELECT 1" not in text
