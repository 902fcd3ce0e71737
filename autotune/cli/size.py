"""``autotune size``: how many GPUs, which tensor parallelism and what it costs for a target
peak rate or concurrency (docs/sizing.md)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.cli._app import app, print_json
from autotune.cli._app import console as _console
from autotune.cli.database import _quiet_optuna
from autotune.cli.report import _need_extra, _write
from autotune.config import load_config
from autotune.planning.prices import merge_prices, parse_price_flags, read_prices
from autotune.planning.replicas import Target
from autotune.planning.size_run import DEVICES_PER_NODE, measured_node, size_deployment
from autotune.planning.size_table import SizeReport, SizeRow, table_cells
from autotune.store import Store
from autotune.workers.gpu_discovery import NoGpuError, find_gpus

__all__: list[str] = []

# small enough that the seed guide's RAG case (docs/method.md#81-online-serving-under-slos; two
# GPU types, three TP sizes each) finishes well within 15 minutes here
# (docs/sizing.md#7-the-seed-guides-rag-case)
DEFAULT_TRIALS = 12


def _target(rate: float | None, concurrency: int | None) -> Target:
    if (rate is None) == (concurrency is None):
        raise typer.BadParameter(
            "give exactly one of --target-rate and --target-concurrency",
            param_hint="'--target-rate'",
        )
    try:
        if rate is not None:
            return Target("rate", rate)
        return Target("concurrency", float(concurrency or 0))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--target-rate'") from None


def _progress(row: SizeRow) -> None:
    what = row.check_text if row.failure is None else f"n/a: {row.failure}"
    print(f"  {row.hardware} TP {row.tensor_parallel_size}: {what}", file=sys.stderr, flush=True)


def _print(report: SizeReport) -> None:
    head, rows = table_cells(report)
    t = Table(title=f"{report.config_name} for {report.target.text} (ranked by {report.ranked_by})")
    for h in head:
        t.add_column(h, justify="left" if h in ("hardware", "check") else "right")
    for cells in rows:
        t.add_row(*cells)
    out = _console()
    out.print(t)
    if report.worker == "vllm":
        print(report.provenance)
    for r in report.rows:
        if r.check_text and r.check != "holds":
            print(f"{r.hardware} TP {r.tensor_parallel_size}: {r.check_text}")
    if report.unpriced:
        print(f"no price for {', '.join(report.unpriced)}: ranked by GPUs")
    gpu_s = report.study_gpu_s
    how = "simulated: what the same studies would take on" if report.worker != "vllm" else "on"
    what = "studies" if report.worker != "vllm" else "studies and replica checks"
    print(f"{what}: {gpu_s / 3600:,.2f} GPU-hours ({how} the GPUs; docs/cost.md)")
    w = report.winner
    if w is None:
        print("no row meets the SLOs at the target")
    else:
        print(f"winner: {w.hardware}, TP {w.tensor_parallel_size}, {w.replicas} replica(s)")
        print(w.command)


def _host_node(per_node: int) -> int:
    """``--worker vllm`` measures on this host: TP sizes up to the devices found here."""
    try:
        found = find_gpus()
        n, where = len(found.devices), found.describe()
    except NoGpuError as exc:
        n, where = 0, f"{exc}: vLLM runs on one device"
    node = measured_node(per_node, n)
    print(f"--worker vllm: TP sizes up to {node} ({where})", file=sys.stderr)
    return node


@app.command("size")
def _size(
    config: Annotated[Path, typer.Option("--config", help="the study config (YAML)")],
    target_rate: Annotated[
        float | None, typer.Option("--target-rate", help="peak requests/s to serve")
    ] = None,
    target_concurrency: Annotated[
        int | None, typer.Option("--target-concurrency", help="peak requests in flight")
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option("--hardware", help="GPU types, comma-separated (default: the config's)"),
    ] = None,
    trials: Annotated[
        int, typer.Option("--trials", min=2, help="trials per GPU type and TP size")
    ] = DEFAULT_TRIALS,
    price: Annotated[
        list[str] | None,
        typer.Option("--price", help="HARDWARE=PRICE per GPU-hour (repeatable); yours only"),
    ] = None,
    prices: Annotated[
        Path | None, typer.Option("--prices", help="YAML file: prices: {HARDWARE: PRICE}")
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", min=1, help="a TP group stays on one node")
    ] = DEVICES_PER_NODE,
    worker: Annotated[
        str,
        typer.Option("--worker", help="sim-virtual (plan on the simulator) or vllm (measure)"),
    ] = "sim-virtual",
    storage: Annotated[
        str | None,
        typer.Option("--storage", help="keep the candidates' studies here (default: discarded)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the table as JSON")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="write the HTML page")] = None,
) -> None:
    """The GPUs, tensor parallelism and replicas that serve a target within the SLOs, with
    the best engine config of each and, given your prices, the cost."""
    target = _target(target_rate, target_concurrency)
    _quiet_optuna()
    if worker not in ("sim-virtual", "vllm"):
        raise typer.BadParameter("sim-virtual or vllm", param_hint="'--worker'")
    cfg = load_config(config)
    kinds = [h.strip() for h in (hardware or cfg.hardware).split(",") if h.strip()]
    if worker == "vllm" and len(kinds) > 1:
        # every row would be measured on this host's own GPUs, whatever its label
        # (docs/sizing.md#9-on-real-workers)
        raise typer.BadParameter(
            f"--worker vllm measures this host's GPUs: give one GPU type, not {', '.join(kinds)}",
            param_hint="'--hardware'",
        )
    price_map = merge_prices(
        read_prices(prices) if prices else None, parse_price_flags(price or [])
    )
    if worker == "vllm":
        gpus_per_node = _host_node(gpus_per_node)
    render = _need_extra("autotune size --html", "autotune.planning.size_html") if html else None
    with tempfile.TemporaryDirectory(prefix="autotune-size-") as tmp:
        url = storage or f"sqlite:///{Path(tmp) / 'size.db'}"
        with Store.open(url) as store:
            report = size_deployment(
                cfg,
                target,
                kinds,
                trials,
                price_map,
                store,
                worker=worker,
                devices_per_node=gpus_per_node,
                progress=None if as_json else _progress,
            )
    if render is not None and html is not None:
        _write(html, render.render_size_html(report))
    if as_json:
        print_json(report.to_json())
    else:
        _print(report)
