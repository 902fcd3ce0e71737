"""A worker that runs ``autotune sim serve`` instead of ``vllm serve``.

It is a :class:`VllmWorker` with another executable: the same argv builder, the same
process-group launch, ``/health`` polling, smoke request, ``/metrics`` scrape and log
classification run against the simulated server, so everything but the GPU is exercised.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.sim import TWIN_PREFIX, is_twin_name
from autotune.workers.guard import GroupRegistry
from autotune.workers.vllm import VllmWorker

__all__ = ["SimWorker", "sim_executable"]


def sim_executable() -> tuple[str, ...]:
    """``vllm_argv`` appends ``serve``: this runs ``python -m autotune.cli sim serve``
    with the interpreter we run under, so the worker sees the same installed package."""
    return (sys.executable, "-m", "autotune.cli", "sim")


class SimWorker(VllmWorker):
    """Simulated vLLM on profile ``hardware``; ``time_scale`` > 1 runs faster than real time.

    The simulator's own flags (``--hardware``, ``--time-scale``, ``--sim-seed``,
    ``--sim-startup-delay``) travel as static args, after any the caller gives. ``gpus``
    becomes the server's ``CUDA_VISIBLE_DEVICES`` as for real vLLM: the simulation ignores
    it, but what each worker was given can be checked (``--sim-dump-env``).
    """

    def __init__(
        self,
        *,
        model: str,
        hardware: str,
        workdir: Path,
        time_scale: float = 1.0,
        sim_seed: int = 0,
        sim_startup_delay: float = 0.0,
        served_model_name: str | None = None,
        static_args: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 60.0,
        env_passthrough: Sequence[str] = (),
        registry: GroupRegistry | None = None,
        gpus: str | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        if is_twin_name(hardware):  # a calibrated profile: the server's cwd differs
            hardware = TWIN_PREFIX + str(Path(hardware.removeprefix(TWIN_PREFIX)).resolve())
        sim_flags = {
            "hardware": hardware,
            "time_scale": time_scale,
            "sim_seed": sim_seed,
            "sim_startup_delay": sim_startup_delay,
        }
        super().__init__(
            executable=sim_executable(),
            model=model,
            served_model_name=served_model_name,
            static_args={**(static_args or {}), **sim_flags},
            env=env or {},
            gpus=gpus,
            host=host,
            startup_timeout_s=startup_timeout_s,
            workdir=workdir,
            env_passthrough=env_passthrough,
            registry=registry,
        )
        self.hardware = hardware
        self._time_scale = time_scale

    @property
    def time_scale(self) -> float:
        """Engine seconds per wall second; load generators scale their clocks by it."""
        return self._time_scale
