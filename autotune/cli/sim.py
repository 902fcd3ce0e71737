"""``autotune sim ...``: built-in profiles, one simulated run, the simulated server."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from autotune.cli._app import console as _console
from autotune.cli._app import print_json as _print_json
from autotune.cli._app import sim_app
from autotune.errors import SimStartupError
from autotune.profiles.hardware import (
    GiB,
    HardwareProfile,
    builtin_cpu_hardware,
    builtin_hardware,
)
from autotune.profiles.models import ModelProfile, builtin_models, get_model
from autotune.sim import EngineArgs

if TYPE_CHECKING:
    from autotune.sim import SimResult

__all__: list[str] = []

log = logging.getLogger("autotune.cli")


# -- sim hardware -------------------------------------------------------------------------


def _hardware_row(h: HardwareProfile) -> dict[str, Any]:
    mns, mnbt = h.vllm_server_defaults()
    return {
        **asdict(h),
        "memory_gib": round(h.memory_gib, 2),
        "peak_bf16_tflops": h.peak_flops / 1e12,
        "hbm_tb_s": h.mem_bw / 1e12,
        "vllm_default_max_num_seqs": mns,
        "vllm_default_max_num_batched_tokens": mnbt,
    }


@sim_app.command("hardware")
def _sim_hardware(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List the built-in profiles: the GPUs, and vLLM's CPU backend."""
    rows = [_hardware_row(h) for h in (*builtin_hardware(), *builtin_cpu_hardware())]
    if as_json:
        _print_json(rows)
        return
    table = Table(
        title="Built-in profiles (a GPU's memory as the CUDA runtime reports it; the CPU "
        "backend's: NUMA node 0)"
    )
    for col in (
        "name",
        "memory GiB",
        "bf16 TFLOP/s",
        "HBM TB/s",
        "eta_bw",
        "eta_f",
        "default max_num_seqs",
        "default max_num_batched_tokens",
        "uncertain",
    ):
        table.add_column(
            col, justify="left" if col in ("name", "uncertain") else "right", no_wrap=col == "name"
        )
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['memory_gib']:.2f}",
            f"{r['peak_bf16_tflops']:.0f}",
            f"{r['hbm_tb_s']:.3g}",
            f"{r['eta_bw']:.2f}",
            f"{r['eta_f']:.2f}",
            str(r["vllm_default_max_num_seqs"]),
            str(r["vllm_default_max_num_batched_tokens"]),
            r["uncertain"],
        )
    _console().print(table)


# -- sim models ---------------------------------------------------------------------------


def _small(x: float) -> str:
    # Two decimals, except for the tiny test model, which would print as 0.00.
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _model_row(m: ModelProfile) -> dict[str, Any]:
    return {
        **asdict(m),
        "params_b": m.num_params / 1e9,
        "weights_gib": m.weight_bytes() / GiB,
        "kv_kib_per_token": m.kv_bytes_per_token() / 1024,
    }


@sim_app.command("models")
def _sim_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List the built-in model profiles (TP=1, bf16)."""
    rows = [_model_row(m) for m in builtin_models()]
    if as_json:
        _print_json(rows)
        return
    table = Table(title="Built-in model profiles")
    for col in (
        "name",
        "params B",
        "layers",
        "hidden",
        "heads q/kv",
        "head_dim",
        "vocab",
        "max positions",
        "weights GiB bf16",
        "KV KiB/token",
    ):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            r["name"],
            _small(r["params_b"]),
            str(r["num_layers"]),
            str(r["hidden_size"]),
            f"{r['num_heads']}/{r['num_kv_heads']}",
            str(r["head_dim"]),
            str(r["vocab_size"]),
            str(r["max_position_embeddings"]),
            _small(r["weights_gib"]),
            f"{r['kv_kib_per_token']:g}",
        )
    _console().print(table)


# -- sim run ------------------------------------------------------------------------------


def _fmt(value: float | int, digits: int = 2) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


# (summary key, label) in print order.
_SUMMARY_ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "completed requests"),
    ("rejected", "rejected requests"),
    ("duration_s", "duration (s)"),
    ("request_throughput", "request throughput (req/s)"),
    ("output_throughput", "output throughput (tok/s)"),
    ("mean_ttft_ms", "mean TTFT (ms)"),
    ("median_ttft_ms", "p50 TTFT (ms)"),
    ("p99_ttft_ms", "p99 TTFT (ms)"),
    ("mean_tpot_ms", "mean TPOT (ms)"),
    ("p99_tpot_ms", "p99 TPOT (ms)"),
    ("num_preemptions", "preemptions"),
)


def _print_run(
    result: SimResult, model: ModelProfile, hw: HardwareProfile, engine_args: EngineArgs
) -> None:
    resolved = engine_args.resolve(model, hw)
    mem = result.memory
    console = _console()
    console.print(f"{model.name} on {hw.name} (simulated)")
    console.print(
        f"engine args: max_model_len={resolved.max_model_len} "
        f"max_num_seqs={resolved.max_num_seqs} "
        f"max_num_batched_tokens={resolved.max_num_batched_tokens} "
        f"gpu_memory_utilization={resolved.gpu_memory_utilization} "
        f"tensor_parallel_size={resolved.tensor_parallel_size}"
    )
    console.print(f"KV cache: {mem.kv_tokens:,} tokens ({mem.num_blocks:,} blocks)")
    console.print(
        f"Maximum concurrency for {resolved.max_model_len:,} tokens per request: "
        f"{mem.max_concurrency:.2f}x"
    )
    summary = result.summary()
    table = Table(title="Simulated benchmark")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label in _SUMMARY_ROWS:
        if key in summary:
            table.add_row(label, _fmt(summary[key]))
    console.print(table)


@sim_app.command("run")
def _sim_run(
    model_name: Annotated[
        str,
        typer.Argument(metavar="MODEL", help="Built-in model name or a folder with config.json."),
    ],
    hardware: Annotated[
        str,
        typer.Option("--hardware", help="GPU profile name, or file:PATH for a calibrated profile."),
    ],
    # at most a million (already minutes of simulation): 1e11 asked numpy for 745 GiB and
    # ended in a MemoryError traceback
    num_requests: Annotated[int, typer.Option(min=1, max=1_000_000)] = 200,
    prompt_mean: Annotated[int, typer.Option(min=1, help="Mean prompt tokens.")] = 512,
    output_mean: Annotated[int, typer.Option(min=1, help="Mean output tokens.")] = 256,
    rate: Annotated[
        float | None,
        typer.Option(min=0.0, help="Poisson arrivals, req/s; omitted or 0 = all at t=0."),
    ] = None,
    seed: int = 0,
    jitter_cv: Annotated[
        float, typer.Option(min=0.0, help="Step-time noise, coefficient of variation.")
    ] = 0.015,
    # vLLM's own flags: passed through unchecked, so bad values fail the way vLLM fails.
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = True,
    tensor_parallel_size: int = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Simulate serving a synthetic workload on one engine config and print vLLM-style results."""
    model = get_model(model_name)
    # Imported here: the engine is the heavy part, and listing profiles must not need it.
    from autotune.sim import hardware_of, lognormal_requests, planning_error, simulate

    # `file:PATH`: a calibrated profile (docs/simulator.md#10-calibrated-profiles)
    hw = hardware_of(hardware)

    given: dict[str, Any] = {
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
    }
    engine_args = EngineArgs(
        **{k: v for k, v in given.items() if v is not None},
        enable_chunked_prefill=enable_chunked_prefill,
        enable_prefix_caching=enable_prefix_caching,
        tensor_parallel_size=tensor_parallel_size,
    )
    requests = lognormal_requests(
        num_requests, prompt_mean, output_mean, seed=seed, rate=rate if rate else None
    )
    try:
        result = simulate(model, hw, engine_args, requests, seed=seed, jitter_cv=jitter_cv)
    except SimStartupError as exc:
        # What a real `vllm serve` would have printed; main() prints the one-line error.
        for line in exc.log_lines:
            log.info("%s", line)
        raise
    for line in result.memory.log_lines:
        log.info("%s", line)
    if as_json:
        _print_json(
            {
                "model": model.name,
                "hardware": hw.name,
                "engine_args": engine_args.resolve(model, hw).as_dict(),
                "kv_cache": {
                    "kv_tokens": result.memory.kv_tokens,
                    "num_blocks": result.memory.num_blocks,
                    "max_concurrency": result.memory.max_concurrency,
                },
                "summary": result.summary(),
                # its error (docs/simulator.md#9-accuracy-against-published-measurements), or
                # a calibrated profile's own line
                "planning_error": planning_error(hw.name).to_dict(),
            }
        )
        return
    _print_run(result, model, hw, engine_args)
    _console().print(planning_error(hw.name).text(), highlight=False)


# -- sim serve ----------------------------------------------------------------------------


@sim_app.command(
    "serve",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    add_help_option=False,
)
def _sim_serve(ctx: typer.Context) -> None:
    """Serve a simulated vLLM (vLLM's flags, OpenAI API, /metrics). See --help."""
    # vLLM's flag grammar (--no-x pairs, unknown flag = error) is argparse's, so the
    # arguments go to argparse untouched rather than through typer.
    from autotune.sim import serve_main

    raise typer.Exit(serve_main(list(ctx.args)))
