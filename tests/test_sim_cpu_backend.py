"""The simulator's CPU backend against real vLLM 0.32 on CPU (docs/simulator.md#41-the-cpu-backend).

Each capture's launch is rebuilt from its own ``non-default args`` line and run on the
built-in ``CPU`` profile with NUMA node 0's memory set to what that launch printed
(``Explicitly set (X/Y) GiB ... on node 0.``: it varied from run to run). The simulator's
startup lines must then appear in the real log, pid and timestamp aside. Where the env var
``VLLM_CPU_KVCACHE_SPACE`` was set, docs/vllm-cpu.md#4-serving and
docs/vllm-cpu.md#7-startup-failures-seen say so (the logs cannot show it).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from support.processes import free_port
from typer.testing import CliRunner

from autotune import cli
from autotune.errors import SimStartupError
from autotune.failures import FailureClass, classify_log
from autotune.profiles.hardware import (
    GiB,
    HardwareProfile,
    builtin_cpu_hardware,
    builtin_hardware,
    get_hardware,
)
from autotune.profiles.models import get_model
from autotune.sim import main as sim_main
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.memory import plan_memory
from autotune.sim.routes import SimServer
from autotune.sim.version import engine_constants
from autotune.workers import parse_cache_config_info, parse_startup_facts

DATA = Path(__file__).parent / "data"
TINY = get_model("autotune/tiny-llama")
CPU = get_hardware("CPU")
GPU = get_hardware("test-4GB")
_ARG_KEYS = {
    "max_model_len",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "kv_cache_memory_bytes",
    "enforce_eager",
}


def read_log(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def norm(line: str) -> str:
    """A log line without its pid and timestamp."""
    return re.sub(r" \d\d-\d\d \d\d:\d\d:\d\d ", " ", re.sub(r"pid=\d+\)", "pid=N)", line))


def launch(lines: list[str], env_gib: int | None = None) -> tuple[EngineArgs, HardwareProfile]:
    """The captured launch's engine args and a CPU profile with its node 0 memory."""
    given = next(ln for ln in lines if "non-default args: " in ln).split("non-default args: ")[1]
    args = {k: v for k, v in ast.literal_eval(given).items() if k in _ARG_KEYS}
    node0 = re.search(
        r"Explicitly set \([\d.]+/([\d.]+)\) GiB for KV cache on node 0", "\n".join(lines)
    )
    assert node0 is not None
    hw = replace(CPU, memory_bytes=int(float(node0.group(1)) * GiB))
    return EngineArgs(**args, cpu_kvcache_space_gib=env_gib), hw


def failure(ea: EngineArgs, hw: HardwareProfile) -> SimStartupError:
    with pytest.raises(SimStartupError) as caught:
        plan_memory(TINY, hw, ea.resolve(TINY, hw))
    return caught.value


def value_error(lines: tuple[str, ...] | list[str]) -> str:
    return next(ln for ln in lines if "ValueError: " in ln).split("ValueError: ", 1)[1]


# -- the profile and the fingerprint ---------------------------------------------------------


def test_cpu_profile_is_found_by_name_but_kept_out_of_the_gpu_list() -> None:
    assert CPU.backend == "cpu" and get_hardware("cpu") is CPU
    assert CPU in builtin_cpu_hardware() and CPU not in builtin_hardware()
    assert {h.backend for h in builtin_hardware()} == {"cuda"}
    assert CPU.uncertain  # its peak and bandwidth are not measured


def test_engine_constants_hash_gpu_values_only() -> None:
    """Cached GPU results are keyed by these (docs/tuning.md#6-the-tuning-quality-benchmark)."""
    c = engine_constants()
    assert c["scheduler"]["block_size"] == "16"
    assert c["scheduler"]["gpu_memory_utilization"] == "0.9"
    assert "cpu_kvcache_space_gib" not in c["scheduler"]
    assert [h["name"] for h in c["hardware"]] == [h.name for h in builtin_hardware()]
    assert all("backend" not in h for h in c["hardware"])


# -- defaults (docs/vllm.md#11-batch-defaults-per-gpu-class) -------------------------------


def test_cpu_defaults_block_size_utilization_and_batch() -> None:
    r = EngineArgs(max_model_len=1024).resolve(TINY, CPU)
    assert (r.block_size, r.gpu_memory_utilization) == (128, 0.92)
    assert (r.max_num_seqs, r.max_num_batched_tokens) == (128, 2048)
    r = EngineArgs(max_model_len=1024, tensor_parallel_size=2).resolve(TINY, CPU)
    assert (r.max_num_seqs, r.max_num_batched_tokens) == (256, 4096)  # times the world size
    assert EngineArgs(block_size=16).resolve(TINY, CPU).block_size == 16  # given: kept


def test_gpu_defaults_are_unchanged_and_ignore_the_cpu_env_var() -> None:
    r = EngineArgs(max_model_len=1024, cpu_kvcache_space_gib=1).resolve(TINY, GPU)
    assert (r.block_size, r.gpu_memory_utilization) == (16, 0.9)
    assert (r.max_num_seqs, r.max_num_batched_tokens) == (256, 2048)
    assert r.kv_cache_memory_bytes is None
    assert GPU.vllm_server_defaults(4) == GPU.vllm_server_defaults() == (256, 2048)


# -- startup lines against real logs ------------------------------------------------------


def test_startup_lines_match_the_capture() -> None:
    """``Explicitly set (0.06/9.09) GiB ...`` and ``CPU KV cache size: 131,072 tokens, ...``."""
    real = read_log("vllm032/startup.log")
    ea, hw = launch(real)
    plan = plan_memory(TINY, hw, ea.resolve(TINY, hw))
    assert len(plan.log_lines) == 3
    assert {norm(ln) for ln in plan.log_lines} <= {norm(ln) for ln in real}
    shared = json.loads((DATA / "vllm032/meta.json").read_text())["server"]["shared"]
    assert (plan.block_size, plan.num_blocks) == (shared["block_size"], shared["num_gpu_blocks"])
    assert parse_startup_facts(plan.log_lines) == parse_startup_facts(real)


def test_env_var_wins_over_the_flag_as_on_real_vllm() -> None:
    """serve8_precedence: ``--kv-cache-memory-bytes 1048576`` with VLLM_CPU_KVCACHE_SPACE=1
    gave 1 GiB of KV; its /metrics page (metrics_after.txt) labels that launch's cache."""
    real = read_log("captures/serve8_precedence.log")
    ea, hw = launch(real, env_gib=1)
    assert ea.kv_cache_memory_bytes == 1048576 and ea.gpu_memory_utilization is None
    engine = Engine(TINY, hw, ea, keep_history=False)
    assert {norm(ln) for ln in engine.memory.log_lines} <= {norm(ln) for ln in real}
    server = SimServer(engine, served_model_name="m", model_path=TINY.name, stats_interval=0)
    sim = parse_cache_config_info(server.metrics.render().decode())
    want = parse_cache_config_info((DATA / "captures/metrics_after.txt").read_text())
    assert sim is not None and want is not None
    keys = ("block_size", "num_gpu_blocks", "gpu_memory_utilization", "kv_cache_size_tokens")
    keys += ("kv_cache_max_concurrency", "kv_cache_memory_bytes", "enable_prefix_caching")
    assert {k: sim[k] for k in keys} == {k: want[k] for k in keys}
    assert want["gpu_memory_utilization"] == "0.92"  # the CPU default, with no flag given


def test_kv_too_small_fails_with_the_cpu_text() -> None:
    real = read_log("captures/bad_c_kvbytes_512tok.log")
    err = failure(*launch(real))
    assert err.failure_class is FailureClass.KV_TOO_SMALL
    assert {norm(ln) for ln in err.log_lines} <= {norm(ln) for ln in real}
    match = classify_log(err.log_lines)
    assert match is not None and match.estimated_max_model_len == 384
    # the same text in the launch of tests/data/vllm032 (util 0.5, node 0 of 9.09 GiB)
    other = read_log("vllm032/failure_kv_too_small.log")
    assert value_error(failure(*launch(other)).log_lines) == value_error(other)


def test_env_var_zero_gives_no_kv_memory() -> None:
    real = read_log("captures/bad_c_kvspace_0.log")
    err = failure(*launch(real, env_gib=0))
    assert err.failure_class is FailureClass.NO_KV_MEMORY
    # the closing RuntimeError names {'EngineCore': 1} or {} from run to run; the rest is equal
    mine = {norm(ln) for ln in err.log_lines if not ln.startswith("RuntimeError")}
    assert mine <= {norm(ln) for ln in real}
    real_match, sim_match = classify_log(real), classify_log(err.log_lines)
    assert real_match is not None and sim_match is not None
    assert real_match.failure_class is sim_match.failure_class


# -- node 0's memory share ----------------------------------------------------------------

# docs/vllm.md#41-free-memory-below-the-request (seen on 0.32 with the default 0.92)
FREE_MEMORY_TEXT = (
    "Available memory on node 0 (7.32/8.71 GiB) on startup is less than desired CPU memory "
    "utilization (0.92, 8.02 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
    "controls the fraction of CPU memory reserved (despite its name). To resolve: decrease "
    "`--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory "
    "used by other processes."
)


def test_share_of_node_0_is_checked_without_an_explicit_kv_size() -> None:
    hw = replace(CPU, memory_bytes=int(8.713 * GiB))
    other = hw.memory_bytes - int(7.32 * GiB)
    err = failure(EngineArgs(max_model_len=1024, sim_other_tenant_bytes=other), hw)
    assert err.failure_class is FailureClass.FREE_MEMORY
    assert value_error(err.log_lines) == FREE_MEMORY_TEXT
    match = classify_log(err.log_lines)
    assert match is not None and match.failure_class is FailureClass.FREE_MEMORY
    # an explicit KV size skips the check on CPU (a real 0.92 with 1 GiB served) ...
    for ea in (
        EngineArgs(max_model_len=1024, sim_other_tenant_bytes=other, cpu_kvcache_space_gib=1),
        EngineArgs(max_model_len=1024, sim_other_tenant_bytes=other, kv_cache_memory_bytes=GiB),
    ):
        assert plan_memory(TINY, hw, ea.resolve(TINY, hw)).available_kv_bytes == GiB
    # ... but not on a GPU, where vLLM checks free memory first whatever the KV size
    ea = EngineArgs(max_model_len=1024, kv_cache_memory_bytes=GiB)
    gpu_err = failure(replace(ea, sim_other_tenant_bytes=GPU.memory_bytes // 2), GPU)
    assert gpu_err.failure_class is FailureClass.FREE_MEMORY
    assert value_error(gpu_err.log_lines).startswith("Free memory on device cuda:0")


def test_auto_sized_kv_is_the_share_of_node_0_less_the_profiled_pieces() -> None:
    r = EngineArgs(max_model_len=1024, gpu_memory_utilization=0.5).resolve(TINY, CPU)
    plan = plan_memory(TINY, CPU, r)
    assert plan.requested_bytes == -(-CPU.memory_bytes // 2)
    assert plan.cudagraph_bytes == 0  # no CUDA graphs on CPU, even without --enforce-eager
    pieces = plan.weights_bytes + plan.activation_bytes + plan.sampler_bytes + plan.non_torch_bytes
    assert plan.available_kv_bytes == plan.requested_bytes - pieces
    assert plan.num_blocks == plan.available_kv_bytes // (64 * 1024)  # 512 B/token x 128
    assert not any("gpu_" in ln or "GPU" in ln for ln in plan.log_lines)


# -- the commands ---------------------------------------------------------------------------


def test_sim_run_takes_the_cpu_profile() -> None:
    run = ["sim", "run", TINY.name, "--hardware", "CPU", "--max-model-len", "1024", "--json"]
    workload = ["--num-requests", "20", "--prompt-mean", "64", "--output-mean", "16"]
    result = CliRunner().invoke(cli.app, [*run, *workload])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    args = data["engine_args"]
    assert (args["block_size"], args["max_num_seqs"], args["max_num_batched_tokens"]) == (
        128,
        128,
        2048,
    )
    assert data["summary"]["completed"] == 20


def test_sim_serve_reads_the_env_var_on_cpu_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def started(*_: object) -> int:  # stands in for serving: startup succeeded
        return 0

    monkeypatch.setattr(sim_main, "_serve", started)
    argv = [TINY.name, "--max-model-len", "1024", "--sim-startup-delay", "0"]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert sim_main.main([*argv, "--hardware", "CPU", "--kv-cache-memory-bytes", "1M"]) == 0
    assert "CPU KV cache size: 2,097,152 tokens" in capsys.readouterr().out
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")
    assert sim_main.main([*argv, "--hardware", "CPU", "--kv-cache-memory-bytes", "1G"]) == 1
    err = capsys.readouterr().err
    assert "Explicitly set (0.0/9.09) GiB for KV cache on node 0." in err
    assert "No available memory for the cache blocks." in err
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.5")  # whole GiB only
    assert sim_main.main([*argv, "--hardware", "CPU"]) == 1
    assert "VLLM_CPU_KVCACHE_SPACE='0.5'" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "nonsense")  # a GPU's vLLM never reads it
    assert sim_main.main([*argv, "--hardware", "test-4GB"]) == 0
    assert "GPU KV cache size" in capsys.readouterr().out


def test_sim_serve_on_cpu_serves_with_the_env_kv_size() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "autotune.cli", "sim", "serve", TINY.name, "--hardware", "CPU"]
    cmd += ["--port", str(port), "--sim-startup-delay", "0", "--max-model-len", "1024"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [*cmd, "--kv-cache-memory-bytes", "1048576"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        page = _metrics_when_ready(port, proc)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    info = parse_cache_config_info(page)
    assert info is not None
    assert (info["kv_cache_memory_bytes"], info["block_size"]) == ("1073741824", "128")
    assert "CPU KV cache size: 2,097,152 tokens" in out


def _metrics_when_ready(port: int, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                return str(r.read().decode())
        except OSError:
            time.sleep(0.05)
    raise AssertionError("server did not become ready")
