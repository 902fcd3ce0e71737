"""Every case of the bad-input catalogue (tests/support/bad_inputs.py): one ``error:`` line
naming the field, file or flag, the documented exit status, and a database left exactly as it
was."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.bad_inputs import BASE, CASES, EXISTING, Case, merged, prepare

from autotune import cli

DOC = Path(__file__).parents[1] / "docs" / "bad-input.md"


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def snapshot(db: Path) -> list[str]:
    """Every row of every table, as SQL (what `sqlite3 .dump` prints)."""
    with sqlite3.connect(db) as conn:
        return list(conn.iterdump())


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A database holding one study (no trials yet), created once for the module."""
    folder = tmp_path_factory.mktemp("seed")
    cfg = folder / "existing.yaml"
    cfg.write_text(yaml.safe_dump(merged(BASE, {"name": EXISTING})), encoding="utf-8")
    db = folder / "seed.db"
    with pytest.raises(SystemExit) as info:
        cli.main(["study", "create", "--config", str(cfg), "--storage", f"sqlite:///{db}"])
    assert info.value.code in (0, None)
    yield db


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)])
        if c.xfail
        else pytest.param(c, id=c.id)
        for c in CASES
    ],
)
def test_bad_input_gives_one_line_and_keeps_the_database(
    case: Case,
    tmp_path: Path,
    seeded: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AUTOTUNE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # a default sqlite:///autotune.db lands here, not in the repo
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    args, db = prepare(case, tmp_path, seeded)
    before = snapshot(db)
    code, _out, err = run_main(args, capsys)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") or lines[0].startswith("autotune sim serve: error:"), err
    assert case.line in lines[0], lines[0]
    assert code == case.code, (code, lines[0])
    assert snapshot(db) == before
    assert not (tmp_path / "autotune.db").exists()  # nothing created by the default URL


def test_the_catalogue_is_large_and_documented() -> None:
    assert len(CASES) >= 75
    assert len({c.id for c in CASES}) == len(CASES)
    doc = DOC.read_text(encoding="utf-8")
    for c in CASES:
        assert f"`{c.id}`" in doc, f"docs/bad-input.md lacks {c.id}: run scripts/bad_input_table.py"


def test_no_error_line_echoes_a_secret(
    tmp_path: Path, seeded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The secret-bearing cases name the field, never the value."""
    for case in CASES:
        if not case.id.startswith(("secret-", "url-unreachable")):
            continue
        args, _db = prepare(case, tmp_path, seeded)
        _code, _out, err = run_main(args, capsys)
        for secret in ("sk-literal-123", "hf_literal", "pw-literal", "pw-secret"):
            assert secret not in err, err
