"""``autotune calibrate``: fit the simulator to a live server and write its profile file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.calibrate import FIT_STARTS, Calibration
from autotune.calibrate.live import ProbeRun
from autotune.calibrate.server_fit import calibrate_live, profile_path, write_profile
from autotune.cli._app import app
from autotune.cli._app import console as _console
from autotune.cli.database import StorageOpt, need_study, study_store
from autotune.errors import AutotuneError
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, twin_constants
from autotune.tuning.measure.twin_round import fit_from_trials
from autotune.tuning.run.create import load_study_config
from autotune.tuning.run.twin_refresh import twin_start
from autotune.tuning.search.plan import model_of
from autotune.workload.build import study_workload

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
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="e.g. http://127.0.0.1:8000")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="built-in model profile, or a folder with config.json"),
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            "--hardware",
            help="the built-in profile the fit starts from (default H100-80GB; --from-study: "
            "the study's)",
        ),
    ] = None,
    from_study: Annotated[
        str | None,
        typer.Option("--from-study", help="fit to the levels this study measured instead"),
    ] = None,
    storage: StorageOpt = None,
    out: Annotated[str, typer.Option("--out", help="the profile file to write")] = "profile.yaml",
    served_model: Annotated[
        str | None, typer.Option("--served-model", help="served model name (default: first)")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="the server's value")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="the server's value")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="the server's value")] = None,
    fit_starts: Annotated[
        int | None,
        typer.Option(
            "--fit-starts",
            min=1,
            max=16,
            help="runs of the fit from seeded starts, the best kept (default: 4 against a "
            "server, 2 from a study; 1 takes about a third of the CPU)",
        ),
    ] = None,
) -> None:
    """Probe a live server for a few minutes, fit the simulator's step-cost and API-server
    constants to it and write a profile file (load it with --hardware file:PATH)."""
    con = _console()
    path = profile_path(out)  # before spending any time on probes or a fit
    if from_study is not None:
        cal = _study_fit(from_study, hardware, storage, fit_starts)
        _done(cal, None, write_profile(cal.spec(), path))
        return
    if base_url is None or model is None:
        raise typer.BadParameter("give --base-url and --model, or --from-study NAME")
    prof = get_model(model)
    base = get_hardware(hardware or "H100-80GB")
    args = EngineArgs(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )

    def progress(run: ProbeRun) -> None:
        figs = ", ".join(f"{o.metric} {o.value * 1e3:.2f} ms" for o in run.observations)
        flushes = f", {run.flushed} flushed in {run.attempts} runs" if run.flushed else ""
        con.print(
            f"probe {run.probe.name}: {run.completed} ok, {run.failed} failed{flushes}; {figs}"
        )

    starts = FIT_STARTS if fit_starts is None else fit_starts
    live = asyncio.run(
        calibrate_live(
            base_url, prof, base, args, served_model=served_model, progress=progress, starts=starts
        )
    )
    _done(live.calibration, live.suite.wall_s, write_profile(live.spec, path))


def _done(cal: Calibration, probe_s: float | None, path: Path) -> None:
    """The fitted constants, the fit's error and where the file went."""
    _console().print(_table(cal))
    res = ", ".join(f"{k} {v:.1f} %" for k, v in cal.residual_pct.items())
    took = f"; probes took {probe_s:.0f} s" if probe_s is not None else ""
    _console().print(f"fit: median error per metric {res}; noise {cal.fit.noise * 100:.1f} %{took}")
    _console().print(f"wrote {path}: use it with --hardware file:{path}")


def _study_fit(
    name: str, hardware: str | None, storage: str | None, starts: int | None
) -> Calibration:
    """The twin fitted to the levels study ``name`` stored (its config's model, workload and
    engine args; ``hardware`` or the study's profile as the base; ``starts`` the fit's runs,
    None for its default)."""
    with study_store(storage, name) as store:
        cfg = load_study_config(need_study(store, name))
        trials = store.trials(name)
    model = model_of(cfg)
    base_name, start = twin_start(None, hardware or cfg.hardware)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    try:
        return fit_from_trials(
            cfg, model, get_hardware(base_name), wl, trials, start=start, starts=starts
        )
    except ValueError as exc:
        raise AutotuneError(str(exc)) from exc
