"""Exit codes per error class, through the console-script entry point
(docs/usage.md#3-errors-and-exit-codes).

Each case provokes the class the way a user would, except where no command can reach it
without a service (WorkerStartupError's own class: a fake command raises it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from support.processes import free_port

from autotune import cli, errors
from autotune.cli import sim as cli_sim
from autotune.failures import FailureClass
from autotune.store import Store
from autotune.store.migrate import VERSION_TABLE

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"

# docs/usage.md's table, in code: one place the tests read it from.
EXPECTED = {
    errors.AutotuneError: 1,
    errors.ConfigError: 1,
    errors.ProfileError: 1,
    errors.WorkerStartupError: 1,
    errors.SimStartupError: 1,
    errors.StorageError: 1,
    errors.MissingExtraError: 1,
    errors.ClientLimitError: 1,
    errors.NotFoundError: 4,
    errors.BusyError: 6,
    errors.ServiceError: 5,
    errors.DatabaseLostError: 5,
}


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    _, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), err


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_every_class_has_its_documented_code() -> None:
    assert {name for name in errors.__all__} == {c.__name__ for c in EXPECTED}
    for cls, code in EXPECTED.items():
        assert cls.exit_code == code, cls.__name__


def test_usage_doc_documents_the_codes() -> None:
    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text(encoding="utf-8")
    for code, meaning in [
        (0, "ok"),
        (1, "error"),
        (2, "usage"),
        (3, "promoted"),
        (4, "not found"),
        (5, "unreachable"),
        (6, "busy"),
        (130, "interrupted"),
    ]:
        assert any(
            line.startswith(f"| {code} |") and meaning in line for line in usage.splitlines()
        ), (code, meaning)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_config_error_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(
        tmp_path, "name: t\nhardware: H100-80GB\nmodel: {name: x}\nworkload: {rate: 1}\nbogus: 1\n"
    )
    db = f"sqlite:///{tmp_path / 'a.db'}"
    code, err = run_main(["study", "create", "--config", str(cfg), "--storage", db], capsys)
    assert code == 1
    assert "bogus" in one_error_line(err)


def test_profile_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["sim", "run", LLAMA_8B, "--hardware", "nope"], capsys)
    assert code == 1
    assert "unknown hardware profile" in one_error_line(err)


def test_sim_startup_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "run", LLAMA_8B, "--hardware", "H100-80GB", "--max-num-seqs", "0"]
    code, err = run_main(args, capsys)
    assert code == 1
    one_error_line(err)


def test_worker_startup_error_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuses() -> None:
        raise errors.WorkerStartupError("worker died at start", FailureClass.ENGINE_DEAD)

    monkeypatch.setattr(cli_sim, "builtin_hardware", refuses)
    code, err = run_main(["sim", "hardware"], capsys)
    assert (code, one_error_line(err)) == (1, "error: worker died at start\n")


def test_storage_error_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    Store.open(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff'"))
    engine.dispose()
    code, err = run_main(["study", "list", "--storage", url], capsys)
    assert code == 1
    assert "newer autotune" in one_error_line(err)


def test_missing_study_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    Store.open(url).close()
    for command in ("show", "best", "export", "run", "delete"):
        code, err = run_main(["study", command, "nope", "--storage", url], capsys)
        assert code == 4, command
        assert "nope" in one_error_line(err)


INFEASIBLE = """
name: hopeless
model: {name: meta-llama/Llama-3.1-8B-Instruct}
hardware: A100-80GB
workload: {num_prompts: 20, input_len: 64, output_len: 8, rate: 2}
slo: {p99_ttft_ms: 0.001}
mode: fixed-rate
strategy: {name: joint, n_trials: 1}
"""


def test_no_feasible_trial_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    cfg = write(tmp_path, INFEASIBLE)
    code, _ = run_main(["study", "create", "--config", str(cfg), "--storage", url, "--run"], capsys)
    assert code in (0, None)
    code, err = run_main(["study", "best", "hopeless", "--storage", url], capsys)
    assert code == 4
    assert "no feasible trial" in one_error_line(err)


def test_unreachable_database_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/autotune"
    code, err = run_main(["study", "list", "--storage", url], capsys)
    assert code == 5
    assert "cannot connect to the study database" in one_error_line(err)


def test_unreachable_server_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    code, err = run_main(["bench", "--base-url", base, "--num-prompts", "1"], capsys)
    assert code == 5
    assert "cannot reach server" in one_error_line(err)


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run_main(["study", "show"], capsys)  # missing argument: the parser's own error
    assert code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune import __version__

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code in (0, None)
    assert capsys.readouterr().out == f"autotune {__version__}\n"
