"""A ``vllm serve`` worker for one trial: isolated launch, the checks once it answers, and
why it died.

The command line (:mod:`autotune.workers.vllm_command`) is stored verbatim with each trial,
so a result can be reproduced by pasting its command. ``/health`` = 200 does not prove the
engine can serve, so every start ends with the checks of
:mod:`autotune.workers.startup_checks` (KV facts, one real completion) before the worker is
handed out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from autotune.failures import FailureClass, FailureMatch, classify_log
from autotune.redact import mask_argv
from autotune.workers.cause import death_class, signal_name
from autotune.workers.env import worker_environment
from autotune.workers.guard import GroupRegistry
from autotune.workers.logs import (
    last_error_line,
    log_tail,
)
from autotune.workers.startup_checks import kv_facts, smoke_test
from autotune.workers.supervisor import ProcessSupervisor, WorkerLaunchError
from autotune.workers.vllm_command import flag_key, format_command, vllm_argv
from autotune.workers.watch import DeathReport, DeathWatch, WorkerDeath

__all__ = ["DEFAULT_ENV", "VllmWorker", "WorkerInfo"]

log = logging.getLogger(__name__)

# Privacy and reproducibility: no telemetry, no hub access during a trial
# (docs/vllm-cpu.md#4-serving).
DEFAULT_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
_PORT_ATTEMPTS = 3  # a freed port can be taken by someone else before vLLM binds it


def _sets_kv_bytes(engine_args: Mapping[str, Any], static_args: Mapping[str, Any]) -> bool:
    return bool(
        engine_args.get("kv_cache_memory_bytes") or static_args.get("kv_cache_memory_bytes")
    )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WorkerInfo:
    """A started, smoke-tested worker. ``startup_s``: launch to ``/health`` 200."""

    base_url: str
    argv: tuple[str, ...]
    command: str
    startup_s: float
    kv_cache_tokens: int | None
    max_concurrency: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    log_path: Path
    pid: int
    smoke_prompt_tokens: int | None = None  # what the server counted for the smoke prompt


class VllmWorker:
    """Runs one ``vllm serve`` at a time, each trial in ``workdir/<trial_name>/``.

    A trial's environment is the allow-listed part of ours (:mod:`autotune.workers.env`:
    the basics, the CUDA/vLLM/HF/... families and the ``env_passthrough`` names), overlaid
    with :data:`DEFAULT_ENV`, then ``env``, then the per-trial ``TMPDIR``/
    ``VLLM_CACHE_ROOT``/``TORCHINDUCTOR_CACHE_DIR`` (each launch leaves
    ZMQ sockets there) and ``CUDA_VISIBLE_DEVICES`` from ``gpus``, which always win.
    """

    smoke_timeout_s = 120.0  # a first request may compile kernels on real vLLM
    metrics_timeout_s = 10.0
    grace_s = 10.0

    def __init__(
        self,
        *,
        executable: Sequence[str] = ("vllm",),
        model: str,
        served_model_name: str | None,
        static_args: Mapping[str, Any],
        env: Mapping[str, str],
        gpus: str | None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 900,
        workdir: Path,
        env_passthrough: Sequence[str] = (),
        registry: GroupRegistry | None = None,
    ) -> None:
        self.executable = tuple(executable)
        # told about every launched process group (the controller records and guards them)
        self.registry = registry
        self.model = model
        self.served_model_name = served_model_name
        self.static_args = dict(static_args)
        self.env = dict(env)
        self.env_passthrough = tuple(env_passthrough)
        self.gpus = gpus
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.workdir = workdir
        self._sup: ProcessSupervisor | None = None
        self._retried_s = 0.0  # lifetimes of this start's launches that lost their port
        self._tmpdir: Path | None = None
        self._watch: DeathWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None

    @property
    def api_key(self) -> str | None:
        """The key the server requires (a static ``api_key``), which the smoke request and
        the load generator must send."""
        for key, value in self.static_args.items():
            if flag_key(key) == "api_key" and value:
                return str(value[0] if isinstance(value, list | tuple) else value)
        return None

    def alive(self) -> bool:
        return self._sup is not None and self._sup.alive()

    def log_lines(self) -> list[str]:
        return self._sup.log_lines() if self._sup is not None else []

    @property
    def death_event(self) -> asyncio.Event | None:
        """Set when the started server is seen dead (see :mod:`autotune.workers.watch`)."""
        return self._watch.event if self._watch is not None else None

    def death(self) -> WorkerDeath | None:
        """Why the started server counts as dead, None while it lives (or was stopped)."""
        return self._watch.death if self._watch is not None else None

    def note_progress(self) -> None:
        """A request completed: the started server makes progress (its death watch counts
        a server without progress as hung, docs/vllm.md#10-whose-death-is-it)."""
        if self._watch is not None:
            self._watch.note_progress()

    def failure(self) -> FailureMatch | None:
        """Why the server died on its own after a successful start (None if it runs, was
        never started, or was stopped by us). Always a runtime class: startup is over;
        ``KILLED`` and ``HUNG`` when it was not the configuration's doing
        (:mod:`autotune.workers.cause`). The line leads with what was seen (which process,
        its exit code or signal), then the log's classified line."""
        sup = self._sup
        death = self.death()
        if sup is None or (
            death is None and (sup.alive() or (sup.stopped and not sup.died_before_stop))
        ):
            return None
        lines = sup.log_lines()
        match = classify_log(lines)
        runtime = match is not None and match.failure_class in (
            FailureClass.RUNTIME_OOM,
            FailureClass.ENGINE_DEAD,
        )
        cls = death_class(
            signal=death.signal if death is not None else signal_name(sup.returncode),
            hung=death is not None and death.cause == "hung",
            log=match,
        )
        if death is None:
            cause = match.line if match is not None and runtime else last_error_line(lines)
            return FailureMatch(cls, cause)
        # what the watch saw leads; a log line only when the log says something (a process
        # killed by a signal leaves no line, and an access-log line would only mislead)
        cause = match.line if match is not None else last_error_line(lines, any_line=False)
        return FailureMatch(cls, f"{death.message}; {cause}" if cause else death.message)

    def death_report(self) -> DeathReport | None:
        """What to store about a death: the watch's facts (cause, process, exit code or
        signal), the failure class and classified line, and the log around it."""
        death, match = self.death(), self.failure()
        if death is None or match is None:
            return None
        lines = self.log_lines()
        found = classify_log(lines)
        return DeathReport(
            death=death,
            failure_class=str(match.failure_class),
            log_line=found.line if found is not None else last_error_line(lines, any_line=False),
            log_context=log_tail(lines, 40, cause=found.line if found is not None else None),
        )

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> WorkerInfo:
        """Launch, wait for ``/health``, smoke-test, read KV capacity.

        A previous server of this worker is stopped first. Raises
        :class:`~autotune.workers.supervisor.WorkerLaunchError` once nothing of the failed
        launch runs any more.
        """
        if not trial_name or trial_name in (".", "..") or "/" in trial_name:
            raise ValueError(f"trial_name must be a plain file name, got {trial_name!r}")
        await self.stop()
        self._watch = None
        trial_dir = self.workdir / trial_name
        trial_dir.mkdir(parents=True, exist_ok=True)
        # vLLM binds ZMQ IPC sockets at $TMPDIR/<36-char uuid>, and a Unix socket path may not
        # exceed 107 bytes: with TMPDIR under a deep workdir the API server dies at startup
        # (seen on real vLLM 0.32). A short per-trial folder in the system temp dir avoids it.
        tmpdir = Path(tempfile.mkdtemp(prefix="at-"))
        self._tmpdir = tmpdir
        inherited = worker_environment(os.environ, passthrough=self.env_passthrough)
        if _sets_kv_bytes(engine_args, self.static_args) and "VLLM_CPU_KVCACHE_SPACE" in inherited:
            # On the CPU backend this variable silently overrides --kv-cache-memory-bytes
            # (seen on vLLM CPU 0.32), so every trial would run with the same KV size.
            log.warning(
                "ignoring the inherited VLLM_CPU_KVCACHE_SPACE: it would override "
                "--kv-cache-memory-bytes"
            )
            del inherited["VLLM_CPU_KVCACHE_SPACE"]
        env = {
            **inherited,
            **DEFAULT_ENV,
            **self.env,
            "TMPDIR": str(tmpdir),
            "VLLM_CACHE_ROOT": str(trial_dir / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(trial_dir / "torchinductor-cache"),
        }
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        self._sup, self._retried_s = None, 0.0
        for attempt in range(_PORT_ATTEMPTS):
            port = _free_port(self.host)
            url_host = f"[{self.host}]" if ":" in self.host else self.host
            base_url = f"http://{url_host}:{port}"
            argv = vllm_argv(
                self.executable,
                self.model,
                engine_args,
                static_args=self.static_args,
                host=self.host,
                port=port,
                served_model_name=self.served_model_name,
            )
            sup = ProcessSupervisor(
                argv,
                env=env,
                log_path=trial_dir / "worker.log",
                health_url=base_url + "/health",
                startup_timeout_s=self.startup_timeout_s,
                grace_s=self.grace_s,
                registry=self.registry,
                trial_name=trial_name,
                tmpdir=tmpdir,
            )
            self._sup = sup
            try:
                startup_s = await sup.start()
                break
            except WorkerLaunchError as exc:
                if exc.failure_class is FailureClass.PORT_IN_USE and attempt + 1 < _PORT_ATTEMPTS:
                    self._retried_s += sup.lifetime_s or 0.0
                    continue
                self._cleanup_tmp()
                raise
            except BaseException:
                self._cleanup_tmp()
                raise
        try:
            key = self.api_key
            auth = {"Authorization": f"Bearer {key}"} if key else None
            async with aiohttp.ClientSession(base_url, headers=auth) as http:
                # KV facts first: they are known once /health answers, and a failed smoke
                # request must not lose them (nor startup_s) for the trial's record.
                facts = await kv_facts(http, sup, self.metrics_timeout_s)
                try:
                    smoke_tokens = await smoke_test(
                        http,
                        sup,
                        model=self.served_model_name or self.model,
                        timeout_s=self.smoke_timeout_s,
                        tokenize_timeout_s=self.metrics_timeout_s,
                    )
                except WorkerLaunchError as exc:
                    exc.startup_s = startup_s
                    exc.kv_cache_tokens = facts["kv_cache_tokens"]
                    exc.max_concurrency = facts["max_concurrency"]
                    raise
        except BaseException:
            await self.stop()
            raise
        assert sup.pid is not None
        self._watch = sup.watch()
        self._watch_task = asyncio.create_task(self._watch.run(), name=f"watch-{trial_name}")
        return WorkerInfo(
            base_url=base_url,
            argv=tuple(mask_argv(argv)),  # what is stored: secrets masked
            command=format_command(argv),
            startup_s=startup_s,
            pid=sup.pid,
            log_path=sup.log_path,
            smoke_prompt_tokens=smoke_tokens,
            **facts,
        )

    def lifetime_s(self) -> float | None:
        """Seconds the last start's processes lived, launch to exit (so far, while they
        run), launches that lost their port included; None before any start."""
        if self._sup is None:
            return None
        return self._retried_s + (self._sup.lifetime_s or 0.0)

    async def stop(self) -> None:
        """Stop the server (its whole process group) and remove the trial's TMPDIR. The
        death watch stops first: our own SIGTERM is no death."""
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # a bug in the watch must not keep the server running
                log.exception("the worker's death watch failed")
        if self._sup is not None:
            await self._sup.stop()
        self._cleanup_tmp()

    def _cleanup_tmp(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
