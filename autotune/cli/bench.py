"""``autotune bench``: a baseline load test against any OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import typer
from pydantic import ValidationError
from rich.live import Live

from autotune.cli._app import app, console
from autotune.config import WorkloadConfig
from autotune.errors import ConfigError
from autotune.inputs import clean_url
from autotune.loadgen.bench import format_result, parse_goodput, run_bench
from autotune.loadgen.sender import ProgressSnapshot

__all__ = ["bench"]

Dataset = Literal["random", "synthetic", "sharegpt-like", "sharegpt", "mooncake", "azure"]


def _workload(
    dataset: str,
    path: str | None,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    rate: float,
    burstiness: float,
    seed: int,
    warmup: int,
    endpoint: str,
) -> WorkloadConfig:
    trace = dataset in ("mooncake", "azure")
    if rate == float("inf"):
        arrival = "trace" if trace else "all-at-once"
    else:
        arrival = "gamma" if burstiness != 1.0 else "poisson"
    try:
        return WorkloadConfig.model_validate(
            {
                "source": dataset,
                "path": path,
                "num_prompts": num_prompts,
                "input_len": input_len,
                "output_len": output_len,
                "range_ratio": range_ratio,
                "arrival": arrival,
                "rate": None if rate == float("inf") else rate,
                "burstiness": burstiness,
                "seed": seed,
                "warmup": warmup,
                "endpoint": endpoint,
            }
        )
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(x) for x in e["loc"]) or "dataset"
        flag = _FLAG_OF_FIELD.get(field, field.replace("_", "-"))
        raise ConfigError(f"--{flag}: {e['msg'].removeprefix('Value error, ')}") from exc


# the bench flag behind each WorkloadConfig field whose name differs (an error names the flag)
_FLAG_OF_FIELD = {
    "rate": "request-rate",
    "input_len": "random-input-len",
    "output_len": "random-output-len",
    "range_ratio": "random-range-ratio",
    "source": "dataset",
    "path": "dataset-path",
}


def _check_base_url(url: str) -> str:
    """An http(s) URL with a host and a numeric port, stripped of surrounding whitespace, or
    a usage error (exit 2)."""
    try:
        url = clean_url(url)
        parts = urlsplit(url)
        parts.port  # noqa: B018  (ValueError for a port that is not a number)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}", param_hint="'--base-url'") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(
            "not an http:// or https:// URL (e.g. http://127.0.0.1:8000)",
            param_hint="'--base-url'",
        )
    return url


@app.command("bench")
def bench(
    base_url: Annotated[str, typer.Option("--base-url", help="e.g. http://127.0.0.1:8000")],
    model: Annotated[str | None, typer.Option(help="served model name (default: first)")] = None,
    endpoint: Annotated[str, typer.Option(help="completions or chat")] = "completions",
    dataset: Annotated[
        str, typer.Option(help="random, synthetic, sharegpt-like, sharegpt, mooncake or azure")
    ] = "random",
    dataset_path: Annotated[str | None, typer.Option(help="file for sharegpt/traces")] = None,
    num_prompts: Annotated[int, typer.Option(help="requests to send")] = 1000,
    duration: Annotated[float | None, typer.Option(help="stop sending after S seconds")] = None,
    random_input_len: Annotated[int, typer.Option(help="random/synthetic prompt len")] = 1024,
    random_output_len: Annotated[int, typer.Option(help="random/synthetic output len")] = 128,
    random_range_ratio: Annotated[float, typer.Option(help="random: +-ratio")] = 0.0,
    request_rate: Annotated[float, typer.Option(help="req/s; inf sends all at once")] = float(
        "inf"
    ),
    burstiness: Annotated[float, typer.Option(help="gamma shape; 1 = Poisson")] = 1.0,
    max_concurrency: Annotated[
        int | None, typer.Option(min=1, help="requests in flight at most")
    ] = None,
    warmup: Annotated[int, typer.Option(help="warm-up requests (not measured)")] = 0,
    goodput: Annotated[
        list[str] | None, typer.Option(help="SLO as KEY:MS (ttft, tpot, e2el); repeat the option")
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    save_result: Annotated[Path | None, typer.Option(help="write the result JSON here")] = None,
    save_detailed: Annotated[bool, typer.Option(help="add per-request records")] = False,
) -> None:
    """Replay a workload against a server and report like `vllm bench serve`."""
    base_url = _check_base_url(base_url)
    if endpoint not in ("completions", "chat"):
        raise ConfigError(f"--endpoint must be completions or chat, not {endpoint!r}")
    try:
        slos = parse_goodput(goodput)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    wl = _workload(
        dataset,
        dataset_path,
        num_prompts,
        random_input_len,
        random_output_len,
        random_range_ratio,
        request_rate,
        burstiness,
        seed,
        warmup,
        endpoint,
    )
    out = console()

    with Live(console=out, transient=True, refresh_per_second=4) as live:

        def progress(p: ProgressSnapshot) -> None:
            p99 = f"{p.p99_ttft_ms:,.0f} ms" if p.p99_ttft_ms is not None else "-"
            live.update(
                f"[{p.phase}] {p.elapsed:7.1f}s  sent {p.sent}/{p.planned}  "
                f"completed {p.completed}  failed {p.failed}  in flight {p.in_flight}"
                f"  p99 TTFT {p99}"
            )

        outcome = asyncio.run(
            run_bench(
                base_url,
                wl,
                model=model,
                endpoint=endpoint,  # type: ignore[arg-type]
                api_key=api_key,
                max_concurrency=max_concurrency,
                duration=duration,
                goodput=slos,
                progress=progress,
            )
        )
    print(format_result(outcome.result.summary))
    if (warning := outcome.client_warning()) is not None:
        print(warning)
    if save_result is not None:
        try:
            save_result.write_text(
                json.dumps(outcome.to_json(save_detailed), indent=2, default=str) + "\n"
            )
        except OSError as exc:
            raise ConfigError(f"{save_result}: cannot write result ({exc.strerror})") from exc
        print(f"result saved to {save_result}")
    if (error := outcome.failure()) is not None:
        raise error
