"""Worker lifecycle: launch a (real or simulated) vLLM server per trial, check it serves,
read its KV capacity, and make sure nothing of it survives ``stop``.

- :mod:`autotune.workers.supervisor`: one process group from launch to empty.
- :mod:`autotune.workers.procstat`: the one reader of ``/proc/PID/stat``.
- :mod:`autotune.workers.vllm_command`: ``vllm serve`` command lines.
- :mod:`autotune.workers.vllm`: :class:`VllmWorker`, checked by
  :mod:`autotune.workers.startup_checks` once it answers.
- :mod:`autotune.workers.sim_worker`: :class:`SimWorker`, the same over ``autotune sim serve``.
- :mod:`autotune.workers.logs`: startup facts and failure classification from logs.
"""

from __future__ import annotations

from autotune.workers.logs import (
    StartupFacts,
    classify_worker_log,
    parse_cache_config_info,
    parse_startup_facts,
)
from autotune.workers.sim_worker import SimWorker
from autotune.workers.supervisor import ProcessSupervisor, WorkerLaunchError
from autotune.workers.vllm import VllmWorker, WorkerInfo
from autotune.workers.vllm_command import format_command, vllm_argv

__all__ = [
    "ProcessSupervisor",
    "SimWorker",
    "StartupFacts",
    "VllmWorker",
    "WorkerInfo",
    "WorkerLaunchError",
    "classify_worker_log",
    "format_command",
    "parse_cache_config_info",
    "parse_startup_facts",
    "vllm_argv",
]
