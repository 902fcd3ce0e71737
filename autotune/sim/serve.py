"""``autotune sim serve``: the simulated engine behind vLLM's command line and HTTP API.

Flags are spelled and defaulted as ``vllm serve`` 0.32 spells them; flags that do not change
the simulation but are common in real launch commands are accepted and logged as ignored;
an unknown flag is an argparse error (exit 2), as in vLLM. Startup prints vLLM's log lines
and fails with vLLM's texts and exit code 1; the port is bound only once the engine is
ready, so ``/health`` never answers before that (as with vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import IO

from aiohttp import web

from autotune.errors import AutotuneError, SimStartupError
from autotune.sim.args import EngineArgs
from autotune.sim.engine import Engine
from autotune.sim.hardware import get_hardware
from autotune.sim.memory import validate_config
from autotune.sim.models import get_model
from autotune.sim.server import VLLM_VERSION, SimServer

__all__ = ["build_parser", "main", "run"]

log = logging.getLogger("autotune.sim.serve")

# Accepted for compatibility with real launch commands; they do not change the simulation.
_IGNORED_WITH_VALUE = (
    "--dtype", "--load-format", "--seed", "--tokenizer", "--swap-space", "--uvicorn-log-level",
    "--max-logprobs", "--generation-config", "--kv-cache-dtype", "--quantization", "--revision",
    "--download-dir", "--distributed-executor-backend", "--show-hidden-metrics-for-version",
    "--compilation-config", "--tokenizer-mode", "--chat-template", "--max-seq-len-to-capture",
)
_IGNORED_FLAGS = (
    "--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--disable-frontend-multiprocessing", "--enable-sleep-mode",
    "--disable-custom-all-reduce",
)


def _human_int(text: str) -> int:
    """vLLM accepts ``32768`` and human forms such as ``32k`` / ``1M`` for lengths."""
    t = text.strip().lower()
    mult = {"k": 1000, "m": 1000**2}.get(t[-1:], 1)
    if t[-1:] in ("k", "m"):
        t = t[:-1]
    try:
        return int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autotune sim serve", allow_abbrev=False,
        description="Serve a simulated vLLM engine with vLLM's OpenAI API and /metrics.")
    p.add_argument("model", help="built-in model name or a folder holding config.json")
    sim = p.add_argument_group("simulation (not vLLM flags)")
    sim.add_argument("--hardware", required=True, help="GPU profile (autotune sim hardware)")
    sim.add_argument("--time-scale", type=float, default=1.0,
                     help="run the engine X times faster than wall time (reported in /version)")
    sim.add_argument("--sim-seed", type=int, default=0)
    sim.add_argument("--sim-request-log", metavar="FILE",
                     help="write per-request timings (engine seconds) as JSON lines")
    sim.add_argument("--sim-startup-delay", type=float, default=1.0,
                     help="seconds standing for model loading (config errors after 1/4 of it)")
    sim.add_argument("--sim-jitter-cv", type=float, default=0.015)
    sim.add_argument("--sim-other-tenant-gib", type=float, default=0.0,
                     help="device memory other processes hold at startup")
    sim.add_argument("--sim-stats-interval", type=float, default=10.0)
    v = p.add_argument_group("vLLM engine and server flags")
    v.add_argument("--max-model-len", type=_human_int)
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--max-num-seqs", type=int)
    v.add_argument("--max-num-batched-tokens", type=_human_int)
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--kv-cache-memory-bytes", type=_human_int)
    v.add_argument("--long-prefill-token-threshold", type=int, default=0)
    v.add_argument("--enforce-eager", action="store_true")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key")
    v.add_argument("--served-model-name", nargs="+")
    ign = p.add_argument_group("accepted and ignored (no effect on the simulation)")
    for flag in _IGNORED_WITH_VALUE:
        ign.add_argument(flag, dest="ignored_" + flag[2:].replace("-", "_"))
    for flag in _IGNORED_FLAGS:
        ign.add_argument(flag, dest="ignored_" + flag[2:].replace("-", "_"), action="store_true")
    return p


def _api(msg: str) -> str:
    return f"(APIServer pid={os.getpid()}) {msg}"


def _emit(lines: tuple[str, ...] | list[str], stream: IO[str]) -> None:
    pid = str(os.getpid())
    for line in lines:
        stream.write(line.replace("pid=1)", f"pid={pid})").replace("pid=2)", f"pid={pid})"))
        stream.write("\n")
    stream.flush()


async def _serve(server: SimServer, host: str, port: int) -> int:
    runner = web.AppRunner(server.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        # uvicorn's wording, which the log classifier maps to PORT_IN_USE
        sys.stderr.write(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on "
                         f"address ('{host}', {port}): {exc.strerror or exc}\n")
        return 1
    print(_api(f"INFO [entry.py:140] Starting vLLM server on http://{host}:{port}"), flush=True)
    print("INFO:     Application startup complete.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("INFO:     Shutting down", flush=True)
    await runner.cleanup()
    return 0


def run(ns: argparse.Namespace) -> int:
    """Start up like vLLM and serve until SIGTERM/SIGINT. Returns the exit code."""
    model = get_model(ns.model)
    hw = get_hardware(ns.hardware)
    ea = EngineArgs(
        max_model_len=ns.max_model_len, gpu_memory_utilization=ns.gpu_memory_utilization,
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        enable_chunked_prefill=ns.enable_chunked_prefill is not False,
        enable_prefix_caching=ns.enable_prefix_caching is not False,
        tensor_parallel_size=ns.tensor_parallel_size, block_size=ns.block_size,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        enforce_eager=ns.enforce_eager,
        sim_other_tenant_bytes=int(ns.sim_other_tenant_gib * 1024**3),
    )
    if ns.time_scale <= 0:
        raise AutotuneError("--time-scale must be positive")
    print(_api(f"INFO [api_utils.py:347] vLLM API server version {VLLM_VERSION} "
               f"(simulated by autotune on {hw.name})"), flush=True)
    defaults = build_parser().parse_args([ns.model, "--hardware", ns.hardware])
    non_default = {k: v for k, v in vars(ns).items()
                   if not k.startswith(("sim_", "ignored_")) and getattr(defaults, k) != v
                   and k not in ("hardware", "time_scale")}
    print(_api(f"INFO [api_utils.py:286] non-default args: {non_default}"), flush=True)
    ignored = [k[len("ignored_"):] for k, v in vars(ns).items()
               if k.startswith("ignored_") and v not in (None, False)]
    if ignored:
        print(_api(f"WARNING [serve.py] flags accepted but ignored by the simulator: "
                   f"{', '.join('--' + i.replace('_', '-') for i in ignored)}"), flush=True)
    resolved = ea.resolve(model, hw)
    delay = max(0.0, ns.sim_startup_delay)
    time.sleep(delay * 0.25)  # config errors surface at import/arg-parse time in vLLM
    try:
        validate_config(model, resolved)
        time.sleep(delay * 0.75)  # memory/KV errors only after model load and profiling
        engine = Engine(model, hw, resolved, seed=ns.sim_seed, jitter_cv=ns.sim_jitter_cv,
                        keep_history=False)
    except SimStartupError as exc:
        _emit(exc.log_lines, sys.stderr)
        return 1
    _emit(engine.memory.log_lines, sys.stdout)
    with contextlib.ExitStack() as stack:
        req_log = (stack.enter_context(open(ns.sim_request_log, "a", encoding="utf-8"))
                   if ns.sim_request_log else None)
        names = ns.served_model_name or [ns.model]
        server = SimServer(engine, served_model_name=names[0], model_path=ns.model,
                           api_key=ns.api_key, time_scale=ns.time_scale, seed=ns.sim_seed,
                           request_log=req_log, stats_interval=ns.sim_stats_interval)
        return asyncio.run(_serve(server, ns.host, ns.port))


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"(APIServer pid={os.getpid()}) %(levelname)s %(message)s")
    try:
        return run(ns)
    except AutotuneError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
