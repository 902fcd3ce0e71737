"""``autotune sim serve``: the simulated engine behind vLLM's command line and HTTP API.

The command line is vLLM's (:mod:`autotune.sim.command_line`). Startup prints vLLM's log
lines and fails with vLLM's texts and exit code 1; the port is bound only once the engine is
ready, so ``/health`` never answers before that (as with vLLM). ``python -m
autotune.sim.main`` runs it as a process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO

from aiohttp import web

from autotune.errors import AutotuneError, SimStartupError
from autotune.profiles.flags import SIM_ONLY_FLAGS
from autotune.profiles.models import get_model
from autotune.sim.args import EngineArgs
from autotune.sim.command_line import IGNORED_PREFIX, build_parser, normalize_argv
from autotune.sim.config_checks import validate_config
from autotune.sim.engine import Engine
from autotune.sim.routes import SimServer
from autotune.sim.twin import hardware_of
from autotune.sim.wire import VLLM_VERSION

__all__ = ["main", "run"]


def _api(msg: str) -> str:
    return f"(APIServer pid={os.getpid()}) {msg}"


def _emit(lines: tuple[str, ...] | list[str], stream: IO[str]) -> None:
    pid = str(os.getpid())
    for line in lines:
        stream.write(line.replace("pid=1)", f"pid={pid})").replace("pid=2)", f"pid={pid})"))
        stream.write("\n")
    stream.flush()


async def _serve(server: SimServer, host: str, port: int) -> int:
    # a client that disconnects cancels its handler, whose cleanup aborts the request, as
    # vLLM's server cancels a completion whose client is gone (its `with_cancellation`):
    # aiohttp leaves such handlers running, and a level the early stop ended then left its
    # sent requests to be parsed, tokenized and prefilled ahead of the next level's
    # (docs/simulator.md#34-the-api-server)
    runner = web.AppRunner(
        server.app(), handle_signals=False, access_log=None, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        # uvicorn's wording, which the log classifier maps to PORT_IN_USE
        sys.stderr.write(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on "
            f"address ('{host}', {port}): {exc.strerror or exc}\n"
        )
        return 1
    print(_api(f"INFO [entry.py:140] Starting vLLM server on http://{host}:{port}"), flush=True)
    print("INFO:     Application startup complete.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The fault hook: SIGUSR1 kills the simulated EngineCore and leaves the API server up
    # (EngineDeadError in the log, /health 503), for tests of worker-death detection.
    loop.add_signal_handler(signal.SIGUSR1, server.fail_engine)
    await stop.wait()
    print("INFO:     Shutting down", flush=True)
    await runner.cleanup()
    return 0


def _dump_env(path: str) -> None:
    """The environment as JSON, into ``path`` or (a folder, as many parallel trials share one
    static flag) into ``path/env-<pid>.json``."""
    target = Path(path)
    if target.is_dir():
        target = target / f"env-{os.getpid()}.json"
    try:
        with open(target, "w", encoding="utf-8") as f:
            json.dump(dict(os.environ), f, sort_keys=True)
    except OSError as exc:
        raise AutotuneError(f"--sim-dump-env: cannot write {target}: {exc}") from exc


def _cpu_kvcache_space() -> int | None:
    """``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) as the CPU backend reads it; unset or empty is
    None (docs/simulator.md#41-the-cpu-backend)."""
    text = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise AutotuneError(
            f"VLLM_CPU_KVCACHE_SPACE={text!r}: a whole number of GiB expected"
        ) from None


def run(ns: argparse.Namespace) -> int:
    """Start up like vLLM and serve until SIGTERM/SIGINT. Returns the exit code."""
    model = get_model(ns.model)
    hw = hardware_of(ns.hardware)
    ea = EngineArgs(
        max_model_len=ns.max_model_len,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_chunked_prefill=ns.enable_chunked_prefill is not False,
        enable_prefix_caching=ns.enable_prefix_caching is not False,
        tensor_parallel_size=ns.tensor_parallel_size,
        block_size=ns.block_size,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        # the CPU backend's env var; a GPU's vLLM never reads it
        cpu_kvcache_space_gib=_cpu_kvcache_space() if hw.is_cpu else None,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        enforce_eager=ns.enforce_eager,
        sim_other_tenant_bytes=int(ns.sim_other_tenant_gib * 1024**3),
    )
    if ns.sim_dump_env:
        _dump_env(ns.sim_dump_env)
    print(
        _api(
            f"INFO [api_utils.py:347] vLLM API server version {VLLM_VERSION} "
            f"(simulated by autotune on {hw.name})"
        ),
        flush=True,
    )
    defaults = build_parser().parse_args([ns.model, "--hardware", ns.hardware])
    non_default = {
        k: v
        for k, v in vars(ns).items()
        if k not in SIM_ONLY_FLAGS
        and not k.startswith(IGNORED_PREFIX)
        and getattr(defaults, k) != v
    }
    print(_api(f"INFO [api_utils.py:286] non-default args: {non_default}"), flush=True)
    ignored = [
        k[len(IGNORED_PREFIX) :]
        for k, v in vars(ns).items()
        if k.startswith(IGNORED_PREFIX) and v not in (None, False)
    ]
    if ignored:
        print(
            _api(
                f"WARNING [serve.py] flags accepted but ignored by the simulator: "
                f"{', '.join('--' + i.replace('_', '-') for i in ignored)}"
            ),
            flush=True,
        )
    resolved = ea.resolve(model, hw)
    delay = max(0.0, ns.sim_startup_delay)
    time.sleep(delay * 0.25)  # config errors surface at import/arg-parse time in vLLM
    try:
        validate_config(model, resolved)
        time.sleep(delay * 0.75)  # memory/KV errors only after model load and profiling
        engine = Engine(
            model, hw, resolved, seed=ns.sim_seed, jitter_cv=ns.sim_jitter_cv, keep_history=False
        )
    except SimStartupError as exc:
        _emit(exc.log_lines, sys.stderr)
        return 1
    _emit(engine.memory.log_lines, sys.stdout)
    with contextlib.ExitStack() as stack:
        req_log = (
            stack.enter_context(open(ns.sim_request_log, "a", encoding="utf-8"))
            if ns.sim_request_log
            else None
        )
        names = ns.served_model_name or [ns.model]
        server = SimServer(
            engine,
            served_model_name=names[0],
            model_path=ns.model,
            api_key=ns.api_key[0] if ns.api_key else None,
            time_scale=ns.time_scale,
            seed=ns.sim_seed,
            request_log=req_log,
            stats_interval=ns.sim_stats_interval,
        )
        return asyncio.run(_serve(server, ns.host, ns.port))


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(normalize_argv(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format=f"(APIServer pid={os.getpid()}) %(levelname)s %(message)s",
    )
    try:
        return run(ns)
    except AutotuneError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
