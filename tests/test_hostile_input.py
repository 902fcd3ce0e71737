"""Hostile input (docs/bad-input.md): a YAML alias bomb refused within a second and a few
megabytes on the CLI and over HTTP, special files refused without blocking, a URL too long
for the service answered as JSON, database URLs cleaned, a refused PostgreSQL login told
apart from an unreachable server, and a full disk reported in one line."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import event
from sqlalchemy.engine import Engine
from support.bad_inputs import BASE, BOMB, merged
from support.services import need_service

from autotune import cli
from autotune.errors import ConfigError, StorageError
from autotune.inputs import MAX_ERROR_CHARS, MAX_YAML_NODES, check_yaml, read_regular_file
from autotune.service.app import Settings, make_app
from autotune.service.limits import MAX_URL_BYTES
from autotune.store import Store
from autotune.store.resilience import Resilience

BUDGET_S = 1.0
BUDGET_BYTES = 50 * 1024 * 1024


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    code = info.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


class Budget:
    """Wall time and peak Python allocation of the block."""

    def __enter__(self) -> Budget:
        tracemalloc.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def test_the_bomb_is_what_it_claims() -> None:
    """The catalogue's bomb, under 1 KB, stands for hundreds of millions of values once its
    aliases are followed (counted on the node graph, which shares each anchored node)."""
    sizes: dict[int, int] = {}

    def expanded(node: yaml.Node) -> int:
        if id(node) not in sizes:
            kids = node.value if isinstance(node.value, list) else []
            flat = (
                [v for pair in kids for v in pair] if isinstance(node, yaml.MappingNode) else kids
            )
            sizes[id(node)] = 1 + sum(expanded(k) for k in flat)
        return sizes[id(node)]

    assert len(BOMB) < 1000
    assert expanded(yaml.compose(BOMB, Loader=yaml.SafeLoader)) > 9**9


def test_a_yaml_bomb_is_refused_fast_on_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB, encoding="utf-8")
    db = tmp_path / "a.db"
    with Budget() as b:
        code, err = run_main(
            ["study", "create", "--config", str(cfg), "--storage", f"sqlite:///{db}"], capsys
        )
    assert code == 1 and err.count("\n") == 1
    assert f"{cfg}:2: YAML aliases (*l0) are not supported" in err
    assert b.seconds < BUDGET_S and b.peak < BUDGET_BYTES, (b.seconds, b.peak)
    assert not db.exists()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Store]]:
    store = Store.open(f"sqlite:///{tmp_path / 'api.db'}")
    settings = Settings(store, tmp_path, spawn=lambda _name: 1)
    async with TestClient(TestServer(make_app(settings))) as client:
        yield client, store
    store.close()


async def test_a_yaml_bomb_is_refused_fast_over_http(
    served: tuple[TestClient[Any, Any], Store],
) -> None:
    client, store = served
    headers = {"Content-Type": "application/yaml"}
    with Budget() as b:
        resp = await client.post("/v1/studies?run=false", data=BOMB, headers=headers)
        body = await resp.json()
    assert resp.status == 400
    assert body["error"]["message"] == (
        "<posted study>:2: YAML aliases (*l0) are not supported; write the value out"
    )
    assert b.seconds < BUDGET_S and b.peak < BUDGET_BYTES, (b.seconds, b.peak)
    assert store.list_studies() == []


async def test_a_url_too_long_gets_json_and_no_traceback(
    served: tuple[TestClient[Any, Any], Store], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = served
    resp = await client.get("/v1/studies/" + "x" * MAX_URL_BYTES)
    assert resp.status == 414 and resp.content_type == "application/json"
    assert "more than the 8,190 allowed" in (await resp.json())["error"]["message"]
    # too long even for the protocol: aiohttp's own 400, logged as one line
    with caplog.at_level(logging.WARNING, logger="aiohttp.server"):
        resp = await client.get("/v1/studies/" + "x" * 70_000)
    assert resp.status == 400
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.exc_info is None for r in records)
    assert "Got more than 65536 bytes" in records[-1].getMessage()
    assert (await client.get("/healthz")).status == 200  # still serving


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for path, why in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (tmp_path, "it is a folder"),
    ):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=why):
            read_regular_file(path, 1024, "config")
        assert time.perf_counter() - t0 < BUDGET_S
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(ConfigError, match="is 2,048 bytes, more than the 1,024 allowed"):
        read_regular_file(big, 1024, "config")
    assert read_regular_file(big, 2048, "config") == b"#" * 2048


def test_yaml_limits_and_what_passes() -> None:
    check_yaml("a: [1, 2]\nb: {c: [[3]]}\n", "ok.yaml")  # no error
    check_yaml("a: [unclosed\n", "bad.yaml")  # syntax errors are the composer's to report
    with pytest.raises(ConfigError, match=r"x\.yaml:3: YAML merge keys"):
        check_yaml("b: &b {r: 1}\nw:\n  <<: *b\n", "x.yaml")
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_NODES:,} values"):
        check_yaml("[" + "1," * MAX_YAML_NODES + "1]", "x.yaml")
    check_yaml("[" + "1," * (MAX_YAML_NODES - 2) + "1]", "x.yaml")  # the list counts too


def write_config(folder: Path, name: str) -> Path:
    cfg = folder / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(merged(BASE, {"name": name})), encoding="utf-8")
    return cfg


def test_a_trailing_newline_in_the_database_url_is_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.db"
    monkeypatch.setenv("AUTOTUNE_DATABASE_URL", f"  sqlite:///{db}\n")
    code, err = run_main(["study", "create", "--config", str(write_config(tmp_path, "nl"))], capsys)
    assert code == 0, err
    assert [p.name for p in tmp_path.glob("*.db")] == ["s.db"]  # no "s.db\n"
    code, err = run_main(["study", "show", "nl"], capsys)
    assert code == 0, err


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://autotune_no_such_role@127.0.0.1:5432/postgres", 'role "autotune_no'),
        ("postgresql://postgres@127.0.0.1:5432/autotune_no_such_db", 'database "autotune_no'),
    ],
)
def test_a_refused_postgres_login_is_a_config_error_not_unreachable(
    url: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
    except psycopg.Error as exc:
        need_service("PostgreSQL", False, str(exc).splitlines()[0])
    code, err = run_main(["study", "list", "--storage", url], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "refused the connection" in err and said in err


@contextmanager
def full_disk() -> Iterator[None]:
    """Every new SQLite connection may not grow its file (SQLITE_FULL), as on a full disk."""

    def cap(dbapi: Any, _record: Any) -> None:
        pages = dbapi.execute("PRAGMA page_count").fetchone()[0]
        dbapi.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(Engine, "connect", cap)
    yield
    event.remove(Engine, "connect", cap)


@pytest.mark.parametrize("seeded", [False, True], ids=["optuna-tables", "study-row"])
def test_a_full_disk_is_one_line(
    seeded: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills before Optuna's tables are made, or (seeded: a study exists) when the
    new study's row is written."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    if seeded:
        code, err = run_main(
            ["study", "create", "--config", str(write_config(tmp_path, "a")), "--storage", db],
            capsys,
        )
        assert code == 0, err
    else:
        Store.open(db).close()  # autotune's schema only
    cfg = write_config(tmp_path, "big")
    # a config too large for the free space left in the file's pages
    cfg.write_text("# " + "x" * 300_000 + "\n" + cfg.read_text(encoding="utf-8"))
    with full_disk():
        code, err = run_main(["study", "create", "--config", str(cfg), "--storage", db], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "is full (no space left on its disk: database or disk is full)" in err
    assert "invalid data" not in err


def test_optunas_wrapped_disk_full_is_translated(tmp_path: Path) -> None:
    """Optuna wraps the driver's error in a StorageInternalError blaming "invalid data ...
    exceeding max length"; the resilience layer every Optuna call goes through says why."""
    conn = sqlite3.connect(tmp_path / "f.db")
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.execute("PRAGMA max_page_count = 2")

    def write() -> None:
        try:
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
        except sqlite3.OperationalError as exc:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit. This typically happens due to "
                "invalid data in the commit, e.g. exceeding max length."
            ) from exc

    with pytest.raises(StorageError, match=r"is full .*database or disk is full"):
        Resilience(f"sqlite:///{tmp_path / 'f.db'}").call("writing", write)
    conn.close()


def test_no_space_left_anywhere_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC outside the database (a report, a log) is the machine's state, not a bug."""
    import autotune.cli.stored_studies as study_cli

    def full(_data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/out/list.json")

    monkeypatch.setattr(study_cli, "print_json", full)
    db = tmp_path / "s.db"
    Store.open(f"sqlite:///{db}").close()
    code, err = run_main(["study", "list", "--json", "--storage", f"sqlite:///{db}"], capsys)
    assert code == 1
    assert err == "error: no space left on the device writing /out/list.json; free some space\n"


async def test_an_echoed_huge_value_is_cut_over_http(
    served: tuple[TestClient[Any, Any], Store],
) -> None:
    client, store = served
    text = yaml.safe_dump(merged(BASE, {"model": {"name": "m" * 20_000}}))
    resp = await client.post(
        "/v1/studies?run=false", data=text, headers={"Content-Type": "application/yaml"}
    )
    message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and message.startswith("unknown model 'mmm")
    assert len(message) <= MAX_ERROR_CHARS and message.endswith("characters in all)")
    assert store.list_studies() == []
