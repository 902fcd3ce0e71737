"""Worker lifecycle: argv building, log parsing on vLLM 0.32 captures, and SimWorker end to
end through ``python -m autotune.cli sim serve`` (the supervisor's own tests are in
test_workers_supervisor.py)."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from pathlib import Path

import pytest
from support.processes import group_gone

from autotune.errors import WorkerStartupError
from autotune.failures import FailureClass
from autotune.workers import (
    SimWorker,
    WorkerLaunchError,
    classify_worker_log,
    format_command,
    parse_cache_config_info,
    parse_startup_facts,
    vllm_argv,
)

CAPTURES = Path(__file__).parent / "data" / "captures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# -- argv --------------------------------------------------------------------------------


def test_vllm_argv_spelling_order_and_round_trip() -> None:
    argv = vllm_argv(
        ["vllm"],
        "/models/my model",
        {
            "max_num_batched_tokens": 8192,
            "enable_prefix_caching": False,
            "block_size": 16,
            "max_model_len": 4096,
            "kv_cache_dtype": None,
            "max_num_seqs": 64,
            "gpu_memory_utilization": 0.9,
            "enable_chunked_prefill": True,
        },
        static_args={"enforce_eager": True, "served-model-name-x": ["a", "b"]},
        host="127.0.0.1",
        port=8011,
        served_model_name="m",
    )
    assert argv == [
        "vllm",
        "serve",
        "/models/my model",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "8192",
        "--block-size",
        "16",
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--served-model-name-x",
        "a",
        "b",
        "--host",
        "127.0.0.1",
        "--port",
        "8011",
        "--served-model-name",
        "m",
    ]
    cmd = format_command(argv)
    assert cmd.startswith("vllm serve '/models/my model' --max-model-len 4096")
    assert shlex.split(cmd) == argv


def test_vllm_argv_rejects_duplicate_and_reserved_flags() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        vllm_argv(
            ["vllm"], "m", {"max_num_seqs": 1}, static_args={"max-num-seqs": 2}, host="h", port=1
        )
    with pytest.raises(ValueError, match="port"):
        vllm_argv(["vllm"], "m", {"port": 1}, host="h", port=1)


def test_vllm_argv_multi_word_executable() -> None:
    argv = vllm_argv(
        [sys.executable, "-m", "autotune.cli", "sim"],
        MODEL,
        {},
        static_args={"hardware": "H100-80GB"},
        host="::1",
        port=9,
    )
    assert argv[:6] == [sys.executable, "-m", "autotune.cli", "sim", "serve", MODEL]
    assert argv[6:] == ["--hardware", "H100-80GB", "--host", "::1", "--port", "9"]


# -- logs --------------------------------------------------------------------------------


def test_parse_startup_facts_gpu_two_line_form() -> None:
    facts = parse_startup_facts(
        [
            "(EngineCore_DP0 pid=7) INFO 05-01 10:00:00 [kv_cache_utils.py:1087] "
            "GPU KV cache size: 474,784 tokens",
            "(EngineCore_DP0 pid=7) INFO 05-01 10:00:00 [kv_cache_utils.py:1091] "
            "Maximum concurrency for 8,192 tokens per request: 57.96x",
        ]
    )
    assert (facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        474784,
        8192,
        57.96,
    )
    assert parse_startup_facts(["nothing here"]).kv_cache_tokens is None


def captures() -> Path:
    return CAPTURES


def test_parse_startup_facts_cpu_capture() -> None:
    lines = (captures() / "serve8_precedence.log").read_text().splitlines()
    facts = parse_startup_facts(lines)
    assert (facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        2097152,
        1024,
        2048.0,
    )


@pytest.mark.parametrize(
    ("name", "cls", "est"),
    [
        ("bad_a_mnbt_lt_mml.log", FailureClass.MNBT_LT_MAXLEN, None),
        ("bad_b_mml_gt_maxpos.log", FailureClass.MAXLEN_GT_MODEL, None),
        ("bad_c_kvbytes_512tok.log", FailureClass.KV_TOO_SMALL, 384),
        ("bad_c_kvspace_0.log", FailureClass.NO_KV_MEMORY, None),
        ("bad_d_mns_0.log", FailureClass.CONFIG_INVALID, None),
    ],
)
def test_classify_worker_log_on_captures(name: str, cls: FailureClass, est: int | None) -> None:
    match = classify_worker_log((captures() / name).read_text().splitlines())
    assert (match.failure_class, match.estimated_max_model_len) == (cls, est)


def test_classify_worker_log_unknown_keeps_last_error_line() -> None:
    match = classify_worker_log(
        [
            "INFO starting",
            "WARNING failed to raise ulimit with error foo",
            "Traceback (most recent call last):",
            "KeyError: 'rope_scaling'",
            "exiting",
        ]
    )
    assert match.failure_class is FailureClass.UNKNOWN
    assert match.line == "KeyError: 'rope_scaling'"


def test_parse_cache_config_info_on_capture() -> None:
    labels = parse_cache_config_info((captures() / "metrics_after.txt").read_text())
    assert labels is not None
    assert labels["kv_cache_size_tokens"] == "2097152"
    assert labels["num_gpu_blocks"] == "16384" and labels["block_size"] == "128"


# -- SimWorker end to end ----------------------------------------------------------------


def sim_worker(tmp_path: Path) -> SimWorker:
    return SimWorker(
        model=MODEL,
        hardware="H100-80GB",
        workdir=tmp_path,
        time_scale=10.0,
        sim_startup_delay=0.0,
        startup_timeout_s=30,
    )


async def test_sim_worker_end_to_end(tmp_path: Path) -> None:
    worker = sim_worker(tmp_path)
    assert worker.time_scale == 10.0
    info = await worker.start(
        {
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.9,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 4096,
        },
        "trial-1",
    )
    try:
        assert info.argv[0] == sys.executable
        assert info.command.startswith(shlex.quote(sys.executable) + " -m autotune.cli sim serve")
        assert info.kv_cache_tokens is not None and info.kv_cache_tokens > 0
        assert info.num_gpu_blocks is not None and info.block_size == 16
        assert info.max_concurrency is not None and info.max_concurrency > 1
        assert info.smoke_prompt_tokens is not None and info.smoke_prompt_tokens >= 16
        assert worker.alive() and worker.failure() is None
        os.kill(info.pid, signal.SIGKILL)  # killed from outside during replay
        for _ in range(100):
            if not worker.alive():
                break
            await asyncio.sleep(0.05)
        failure = worker.failure()
        # not the configuration's doing (autotune/workers/cause.py): retried, no verdict
        assert failure is not None and failure.failure_class is FailureClass.KILLED
    finally:
        await worker.stop()
    assert group_gone(info.pid) and (tmp_path / "trial-1/worker.log").is_file()


@pytest.mark.parametrize(
    ("engine_args", "cls", "est"),
    [
        ({"max_num_seqs": 512, "max_num_batched_tokens": 256}, FailureClass.MNBT_LT_MNS, None),
        ({"gpu_memory_utilization": 0.3, "max_model_len": 131072}, FailureClass.KV_TOO_SMALL, True),
    ],
)
async def test_sim_worker_startup_failures(
    tmp_path: Path, engine_args: dict[str, float], cls: FailureClass, est: bool | None
) -> None:
    worker = sim_worker(tmp_path)
    with pytest.raises(WorkerStartupError) as info:
        await worker.start(engine_args, "bad")
    err = info.value
    assert isinstance(err, WorkerLaunchError) and err.failure_class is cls
    if est:
        assert err.estimated_max_model_len is not None
        assert 0 < err.estimated_max_model_len < 131072
    assert not worker.alive() and not (tmp_path / "bad/tmp").exists()
