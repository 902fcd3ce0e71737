"""Shared by the real-vLLM fixtures and tests: settings, captures, process helpers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.failures import FailureMatch
from autotune.workers import VllmWorker, WorkerInfo
from autotune.workers.procstat import group_stats
from autotune.workers.watch import DeathReport, WorkerDeath

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV_SCRIPT = REPO / "scripts" / "vllm_cpu_env.sh"
VENV_MARKER = ".autotune-vllm-ready"  # written by ENV_SCRIPT after a verified install
DATA_DIR = REPO / "tests" / "data" / "vllm032"
META = "meta.json"

MiB = 1024**2
SERVED_MODEL = "autotune/tiny-llama"  # the simulator's built-in profile of the same model
KV_BYTES_PER_TOKEN = 512  # 2 layers x 2 KV heads x head_dim 32 x (K, V) x bf16
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend default
SERVER_KV_BYTES = 64 * MiB
SERVER_ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": 1024,
    "gpu_memory_utilization": 0.5,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 1024,
}
# the shared server's tensor parallelism, as `autotune size --worker vllm` sets a candidate's
SERVER_TP: dict[str, Any] = {"tensor_parallel_size": 1}
STARTUP_TIMEOUT_S = 300.0
# the shared server's workdir is at least this long (test_deep_workdir_still_starts)
DEEP_WORKDIR_CHARS = 80
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# Measured seconds, printed at the end of the session (CI's log keeps them).
TIMINGS: dict[str, float] = {}


# -- the process group ------------------------------------------------------------------


def group_members(pgid: int) -> list[tuple[int, str]]:
    """``(pid, state)`` of every live process whose process group is ``pgid``."""
    return [(s.pid, s.state) for s in group_stats(pgid) or () if not s.dead]


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(
        item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
    )


# -- captures ---------------------------------------------------------------------------


@dataclass
class Captures:
    """What the real server produced, with machine paths replaced by placeholders.

    Always written to ``folder`` (the session's temp dir, for debugging); with
    ``AUTOTUNE_RECAPTURE=1`` also to ``tests/data/vllm032/``. :meth:`note` collects facts
    (settings, results) for ``meta.json``, which :meth:`write_meta` merges into the one
    already there, so recapturing a subset of the tests keeps the rest.
    """

    folder: Path
    replacements: dict[str, str] = field(default_factory=dict)
    recapture: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def clean(self, text: str) -> str:
        for old, new in sorted(self.replacements.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(old, new)
        return text

    def save(self, name: str, text: str) -> Path:
        text = self.clean(text)
        path = self.folder / name
        path.write_text(text, encoding="utf-8")
        if self.recapture:
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            (DATA_DIR / name).write_text(text, encoding="utf-8")
        return path

    def note(self, section: str, key: str, value: Any) -> None:
        self.meta.setdefault(section, {})[key] = value

    def write_meta(self) -> None:
        if not self.meta:
            return
        old: dict[str, Any] = {}
        if self.recapture and (DATA_DIR / META).is_file():
            old = json.loads((DATA_DIR / META).read_text(encoding="utf-8"))
        for section, values in self.meta.items():
            merged = old.get(section)
            old[section] = (
                {**merged, **values}
                if isinstance(merged, dict) and isinstance(values, dict)
                else values
            )
        self.save(
            META,
            json.dumps(json.loads(self.clean(json.dumps(old))), indent=2, sort_keys=True) + "\n",
        )


def make_worker(
    venv: Path, model: Path, workdir: Path, *, static_args: Mapping[str, Any] | None = None
) -> VllmWorker:
    """A worker as a study would configure one for this machine (eager, explicit KV)."""
    static = {
        "enforce_eager": True,
        "kv_cache_memory_bytes": SERVER_KV_BYTES,
        **(static_args or {}),
    }
    return VllmWorker(
        executable=[str(venv / "bin" / "vllm")],
        model=str(model),
        served_model_name=SERVED_MODEL,
        static_args=static,
        env={**WORKER_ENV, "HF_HOME": str(workdir / "hf-home")},
        gpus=None,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        workdir=workdir,
    )


@dataclass(frozen=True)
class RealServer:
    worker: VllmWorker
    info: WorkerInfo
    engine_args: dict[str, Any]
    kv_cache_memory_bytes: int
    model_dir: Path

    @property
    def base_url(self) -> str:
        return self.info.base_url

    @property
    def model(self) -> str:
        return SERVED_MODEL


class AdoptedWorker:
    """A started :class:`VllmWorker` in the shape a trial runner drives: ``start`` hands out
    the running server instead of launching one (so a trial can run on the shared server);
    the rest, its death watch included, is the worker's own."""

    def __init__(self, worker: VllmWorker, info: WorkerInfo) -> None:
        self.worker, self.info = worker, info

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> WorkerInfo:
        return self.info

    @property
    def death_event(self) -> Any:
        return self.worker.death_event

    @property
    def api_key(self) -> str | None:
        return self.worker.api_key

    def death(self) -> WorkerDeath | None:
        return self.worker.death()

    def death_report(self) -> DeathReport | None:
        return self.worker.death_report()

    def failure(self) -> FailureMatch | None:
        return self.worker.failure()

    def note_progress(self) -> None:
        self.worker.note_progress()

    # what the runner counts the worker's cost from (docs/cost.md#1-what-is-counted)
    @property
    def static_args(self) -> dict[str, Any]:
        return self.worker.static_args

    @property
    def gpus(self) -> str | None:
        return self.worker.gpus

    def lifetime_s(self) -> float | None:
        return self.worker.lifetime_s()

    async def stop(self) -> None:
        await self.worker.stop()


def engine_core_pid(pgid: int) -> int:
    """The EngineCore process of a vLLM server (vLLM retitles it ``VLLM::EngineCore``)."""
    for pid, _ in group_members(pgid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"VLLM::EngineCore"):
            return pid
    raise AssertionError(f"no VLLM::EngineCore in process group {pgid}: {group_members(pgid)}")
