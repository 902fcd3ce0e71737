"""``autotune calibrate``: fit the simulator to a live server and write its profile file."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from autotune.calibrate import Calibration
from autotune.calibrate.live import ProbeRun
from autotune.calibrate.server_fit import calibrate_live, write_profile
from autotune.cli._app import app
from autotune.cli._app import console as _console
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, twin_constants

__all__: list[str] = []


def _table(cal: Calibration) -> Table:
    t = Table(title=f"Fitted constants (base profile {cal.base})")
    for col in ("constant", "fitted", "± std. error", "base"):
        t.add_column(col, justify="left" if col == "constant" else "right")
    base = twin_constants(get_hardware(cal.base))
    for key, v in cal.values.items():
        t.add_row(f"{key[0]}.{key[1]}", f"{v:.4g}", f"{cal.stderr[key]:.2g}", f"{base[key]:.4g}")
    return t


@app.command("calibrate")
def _calibrate(
    base_url: Annotated[str, typer.Option("--base-url", help="e.g. http://127.0.0.1:8000")],
    model: Annotated[
        str, typer.Option("--model", help="built-in model profile, or a folder with config.json")
    ],
    hardware: Annotated[
        str, typer.Option("--hardware", help="the built-in profile the fit starts from")
    ] = "H100-80GB",
    out: Annotated[str, typer.Option("--out", help="the profile file to write")] = "profile.yaml",
    served_model: Annotated[
        str | None, typer.Option("--served-model", help="served model name (default: first)")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="the server's value")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="the server's value")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="the server's value")] = None,
) -> None:
    """Probe a live server for a few minutes, fit the simulator's step-cost and API-server
    constants to it and write a profile file (load it with --hardware file:PATH)."""
    prof = get_model(model)
    base = get_hardware(hardware)
    args = EngineArgs(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    con = _console()

    def progress(run: ProbeRun) -> None:
        figs = ", ".join(f"{o.metric} {o.value * 1e3:.2f} ms" for o in run.observations)
        con.print(f"probe {run.probe.name}: {run.completed} ok, {run.failed} failed; {figs}")

    live = asyncio.run(
        calibrate_live(base_url, prof, base, args, served_model=served_model, progress=progress)
    )
    cal = live.calibration
    con.print(_table(cal))
    res = ", ".join(f"{k} {v:.1f} %" for k, v in cal.residual_pct.items())
    con.print(
        f"fit: median error per metric {res}; noise {cal.fit.noise * 100:.1f} %; "
        f"probes took {live.suite.wall_s:.0f} s"
    )
    path = write_profile(live.spec, out)
    con.print(f"wrote {path}: use it with --hardware file:{path}")
