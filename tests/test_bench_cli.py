"""``autotune bench`` through its command line against the simulated server (run in a thread,
since the command runs its own event loop): ``--save-detailed`` writes every request, and a
run in which every request fails exits non-zero with one line saying why."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from support.processes import free_port

from autotune import cli
from autotune.loadgen.tokens import clear_cache
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def sim_url() -> Iterator[str]:
    """A simulated server on a free port, served from its own thread and loop."""
    clear_cache()
    port = free_port()
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    runner_box: list[web.AppRunner] = []

    async def serve() -> None:
        eng = Engine(get_model(MODEL), get_hardware("H100-80GB"), EngineArgs(max_model_len=2048))
        srv = SimServer(eng, served_model_name=MODEL, model_path=MODEL, time_scale=20.0)
        runner = web.AppRunner(srv.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runner_box.append(runner)
        ready.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True
    )
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    clear_cache()


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (0 if code is None else code if isinstance(code, int) else 1), out, err


def test_save_detailed_writes_every_request(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "result.json"
    args = ["bench", "--base-url", sim_url, "--num-prompts", "6", "--random-input-len", "200"]
    args += ["--random-output-len", "8", "--save-result", str(path), "--save-detailed"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    assert "Serving Benchmark Result" in out and f"result saved to {path}" in out
    data = json.loads(path.read_text())
    assert data["completed"] == 6 and len(data["requests"]) == 6
    for r in data["requests"]:
        assert r["success"] is True and r["prompt_len"] == r["prompt_tokens"] == 200
        assert r["output_tokens"] == 8 and len(r["itl"]) == 7
        # tokens may share one read on a busy host (ITL 0): check the fields agree instead
        assert r["tpot"] == pytest.approx((r["e2el"] - r["ttft"]) / 7, abs=1e-9)


def test_run_whose_requests_all_fail_exits_non_zero_with_one_line(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "result.json"
    args = ["bench", "--base-url", sim_url, "--num-prompts", "4", "--random-input-len", "64"]
    args += ["--model", "no-such-model", "--save-result", str(path)]
    code, out, err = run_main(args, capsys)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("error: all 4 requests failed (4 http_404)")
    assert "does not exist" in err
    # the result is still printed and saved, for the record
    assert "Failed requests:" in out and json.loads(path.read_text())["failed"] == 4
