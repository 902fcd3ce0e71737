"""The environment a worker receives: the allow-list, worker.env and env_passthrough, seen
from inside a real worker process (the simulated server dumps what it received)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.workers import SimWorker
from autotune.workers.env import allowed, worker_environment

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINE = {
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
}
# What a controller's environment holds that no worker needs.
SECRETS = {
    "AUTOTUNE_DATABASE_URL": "postgresql+psycopg://autotune:db-secret@db/autotune",
    "OPENAI_API_KEY": "sk-controller-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "GITHUB_TOKEN": "gh-secret",
    "DATABASE_PASSWORD": "pw-secret",
    "MY_PLUGIN_SETTING": "plugin",
}
# One of each family the allow-list passes.
PASSED = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NVIDIA_DRIVER_CAPABILITIES": "compute",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "INFO",
    "HF_HOME": "/tmp/hf",
    "TRANSFORMERS_VERBOSITY": "error",
    "TORCH_HOME": "/tmp/torch",
    "TRITON_CACHE_DIR": "/tmp/triton",
    "OMP_NUM_THREADS": "2",
    "KMP_AFFINITY": "disabled",
    "XDG_CACHE_HOME": "/tmp/xdg",
    "PYTHONHASHSEED": "0",
    "LD_LIBRARY_PATH": "/opt/lib",
}


def test_the_allow_list() -> None:
    for name in (*PASSED, "PATH", "HOME", "TMPDIR", "VIRTUAL_ENV", "LD_PRELOAD", "PYTHONPATH"):
        assert allowed(name), name
    for name in (*SECRETS, "SSH_AUTH_SOCK", "PGPASSWORD", "KUBECONFIG", "DOCKER_HOST"):
        assert not allowed(name), name
    env = worker_environment(
        {**SECRETS, **PASSED, "PATH": "/bin"},
        passthrough=["MY_PLUGIN_*", "DATABASE_PASSWORD"],
        extra={"OMP_NUM_THREADS": "8", "EXTRA": "x"},
    )
    assert env["MY_PLUGIN_SETTING"] == "plugin" and env["DATABASE_PASSWORD"] == "pw-secret"
    assert env["OMP_NUM_THREADS"] == "8" and env["EXTRA"] == "x"  # worker.env wins
    assert "AUTOTUNE_DATABASE_URL" not in env and "OPENAI_API_KEY" not in env


async def test_a_worker_receives_only_the_allow_listed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**SECRETS, **PASSED}.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "env.json"
    worker = SimWorker(
        model=MODEL,
        hardware="H100-80GB",
        workdir=tmp_path / "work",
        time_scale=10.0,
        sim_startup_delay=0.0,
        startup_timeout_s=30,
        static_args={"sim_dump_env": str(dump)},
        env={"EXTRA_FROM_CONFIG": "yes"},
        env_passthrough=["MY_PLUGIN_*"],
    )
    await worker.start(ENGINE, "trial-0")
    try:
        got = json.loads(dump.read_text(encoding="utf-8"))
    finally:
        await worker.stop()
    for name, value in PASSED.items():
        assert got.get(name) == value, name
    assert got["EXTRA_FROM_CONFIG"] == "yes" and got["MY_PLUGIN_SETTING"] == "plugin"
    assert got["VLLM_NO_USAGE_STATS"] == "1"  # autotune's defaults
    assert got["TMPDIR"] != PASSED.get("TMPDIR") and "VLLM_CACHE_ROOT" in got  # per trial
    for name in SECRETS:
        if name != "MY_PLUGIN_SETTING":
            assert name not in got, name
    text = json.dumps(got)
    for secret in ("db-secret", "sk-controller-secret", "aws-secret", "gh-secret", "pw-secret"):
        assert secret not in text
