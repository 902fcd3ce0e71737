"""The command line, through typer's CliRunner, through main() and as a real process."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from typer.testing import CliRunner

from autotune import cli
from autotune.cli import sim as cli_sim
from autotune.errors import ProfileError

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
# A small workload: enough requests to fill a batch, quick to simulate.
SMALL_RUN = ["--num-requests", "50", "--prompt-mean", "256", "--output-mean", "64"]

runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    # The CLI's callback configures the root logger; leave it as other tests expect it.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def engine() -> ModuleType:
    import autotune.sim.engine

    return autotune.sim.engine


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the console-script entry point in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


# -- CliRunner ----------------------------------------------------------------------------


def test_help() -> None:
    result = runner.invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    assert "sim" in result.output
    result = runner.invoke(cli.app, ["sim", "--help"])
    assert result.exit_code == 0
    for command in ("hardware", "models", "run"):
        assert command in result.output


def test_sim_hardware_table() -> None:
    result = runner.invoke(cli.app, ["sim", "hardware"])
    assert result.exit_code == 0, result.output
    assert "H100-80GB" in result.output
    assert "A100-80GB" in result.output


def test_sim_hardware_json() -> None:
    result = runner.invoke(cli.app, ["sim", "hardware", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert {"H100-80GB", "A100-80GB"} <= rows.keys()
    h100 = rows["H100-80GB"]
    assert h100["memory_gib"] == pytest.approx(79.2, abs=0.01)
    assert h100["peak_bf16_tflops"] == pytest.approx(989)
    assert h100["vllm_default_max_num_seqs"] == 1024
    assert h100["vllm_default_max_num_batched_tokens"] == 8192
    assert rows["A100-80GB"]["vllm_default_max_num_batched_tokens"] == 2048
    # the CPU backend's profile, with vLLM's CPU batch defaults
    cpu = rows["CPU"]
    assert cpu["backend"] == "cpu" and h100["backend"] == "cuda"
    assert (cpu["vllm_default_max_num_seqs"], cpu["vllm_default_max_num_batched_tokens"]) == (
        128,
        2048,
    )


def test_sim_models_table() -> None:
    result = runner.invoke(cli.app, ["sim", "models"])
    assert result.exit_code == 0, result.output
    assert LLAMA_8B in result.output
    assert "Qwen/Qwen2.5-7B-Instruct" in result.output


def test_sim_models_json() -> None:
    result = runner.invoke(cli.app, ["sim", "models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows[LLAMA_8B]["kv_kib_per_token"] == 128
    assert rows[LLAMA_8B]["weights_gib"] == pytest.approx(14.96, abs=0.01)
    assert rows["Qwen/Qwen2.5-7B-Instruct"]["params_b"] == pytest.approx(7.62, abs=0.01)


def test_unknown_hardware_is_a_profile_error() -> None:
    result = runner.invoke(cli.app, ["sim", "run", LLAMA_8B, "--hardware", "nope"])
    assert result.exit_code == 1
    assert isinstance(result.exception, ProfileError)


def test_log_level_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["--log-level", "chatty", "sim", "hardware"], capsys)
    assert code == 1
    assert err.startswith("error: unknown log level 'chatty'")


# -- main(): the one-line error contract --------------------------------------------------


def test_main_unknown_hardware_prints_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["sim", "run", LLAMA_8B, "--hardware", "nope"], capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: unknown hardware profile 'nope'")


def test_main_unknown_model_prints_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["sim", "run", "no/such-model", "--hardware", "H100-80GB"], capsys)
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("error: unknown model 'no/such-model'")


def test_main_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_main(["sim", "no-such-command"], capsys)
    assert code == 2


def test_main_keyboard_interrupt_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_sim, "builtin_hardware", interrupted)
    code, _, _ = run_main(["sim", "hardware"], capsys)
    assert code == 130


def test_main_lets_bugs_through(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only AutotuneError becomes a one-line error; anything else is a bug with a traceback.
    def broken() -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(cli_sim, "builtin_hardware", broken)
    with pytest.raises(RuntimeError, match="bug"):
        cli.main(["sim", "hardware"])


# -- sim run ------------------------------------------------------------------------------


def test_sim_run_prints_startup_facts_and_table(engine: ModuleType) -> None:
    result = runner.invoke(cli.app, ["sim", "run", LLAMA_8B, "--hardware", "H100-80GB", *SMALL_RUN])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "KV cache:" in out and "tokens" in out
    assert "Maximum concurrency for 131,072 tokens per request" in out
    for label in (
        "completed requests",
        "request throughput",
        "output throughput",
        "mean TTFT (ms)",
        "p99 TTFT (ms)",
        "mean TPOT (ms)",
        "preemptions",
    ):
        assert label in out
    # Box characters depend on the output encoding; the row is "label ... 50" either way.
    assert re.search(r"completed requests\W+50\b", out)


def test_sim_run_json(engine: ModuleType) -> None:
    result = runner.invoke(
        cli.app,
        [
            "sim",
            "run",
            LLAMA_8B,
            "--hardware",
            "H100-80GB",
            "--max-model-len",
            "4096",
            "--rate",
            "20",
            "--json",
            *SMALL_RUN,
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engine_args"]["max_model_len"] == 4096
    assert data["engine_args"]["max_num_seqs"] == 1024
    assert data["kv_cache"]["kv_tokens"] > 0
    summary = data["summary"]
    assert summary["completed"] + summary["rejected"] == 50
    assert summary["completed"] > 0
    assert summary["mean_ttft_ms"] > 0


def test_sim_run_startup_failure_prints_vllms_text(
    engine: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(
        ["sim", "run", LLAMA_8B, "--hardware", "H100-80GB", "--max-num-seqs", "0", *SMALL_RUN],
        capsys,
    )
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: ")
    # pydantic's wording, as vLLM 0.32 prints it (docs/vllm.md#43-config-validation)
    assert "max_num_seqs" in err
    assert "greater than or equal to 1" in err


# -- a real process -----------------------------------------------------------------------


def _autotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_subprocess_help_listing_and_error() -> None:
    proc = _autotune("--help")
    assert proc.returncode == 0, proc.stderr
    assert "sim" in proc.stdout

    proc = _autotune("sim", "models", "--json")
    assert proc.returncode == 0, proc.stderr
    assert LLAMA_8B in {r["name"] for r in json.loads(proc.stdout)}

    proc = _autotune("sim", "run", LLAMA_8B, "--hardware", "nope")
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr


def test_subprocess_sim_run(engine: ModuleType) -> None:
    proc = _autotune("sim", "run", LLAMA_8B, "--hardware", "H100-80GB", *SMALL_RUN)
    assert proc.returncode == 0, proc.stderr
    assert "mean TTFT (ms)" in proc.stdout
