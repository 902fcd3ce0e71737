"""One calibration from end to end: probe a live server, fit, write the profile file.

``autotune calibrate`` calls :func:`calibrate_live`; the fit itself is pure
(:mod:`autotune.calibrate.twin_fit`), this module is the edge that talks to the server and
writes the file (docs/calibrate.md#1-the-command).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from autotune.calibrate.live import ProbeRun, SuiteRun, run_suite
from autotune.calibrate.probes import Probe, default_suite
from autotune.calibrate.twin_fit import FIT_STARTS, Calibration, fit_twin
from autotune.errors import AutotuneError, ConfigError
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, TwinFile, dump_twin

__all__ = [
    "LiveCalibration",
    "calibrate_live",
    "measured_here",
    "profile_path",
    "suite_for",
    "write_profile",
]


@dataclass(frozen=True)
class LiveCalibration:
    """The suite as it ran, the fit, and the profile file it makes."""

    suite: SuiteRun
    calibration: Calibration
    spec: TwinFile


def measured_here(base_url: str, vllm: str | None, model: str | None) -> dict[str, str | None]:
    """The twin file's ``measured`` block: the server's vLLM version and model, its host (this
    machine's name for a loopback address) and today's date."""
    host = urlsplit(base_url).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1", ""):
        host = socket.gethostname()
    return {"vllm": vllm, "model": model, "host": host, "when": dt.date.today().isoformat()}


def suite_for(model: ModelProfile, base: HardwareProfile, args: EngineArgs) -> list[Probe]:
    """The default probe suite for a server of ``args``' limits, as resolved on ``base``."""
    r = args.resolve(model, base)
    return default_suite(r.max_model_len, r.max_num_seqs, r.max_num_batched_tokens)


async def calibrate_live(
    base_url: str,
    model: ModelProfile,
    base: HardwareProfile,
    args: EngineArgs,
    *,
    served_model: str | None = None,
    api_key: str | None = None,
    probes: Sequence[Probe] | None = None,
    progress: Callable[[ProbeRun], None] | None = None,
    starts: int = FIT_STARTS,
) -> LiveCalibration:
    """Probe ``base_url`` with the default suite for ``args``' limits and fit the twin.

    ``args`` are the server's engine args as far as known (the probes stay inside its
    ``max_model_len``, ``max_num_seqs`` and ``max_num_batched_tokens``; the twin replays the
    probes with them). ``probes`` replaces the default suite; ``starts``, the fit's runs
    (:func:`fit_twin`). Raises AutotuneError when no probe completed a request.
    """
    suite = list(probes) if probes is not None else suite_for(model, base, args)
    run = await run_suite(base_url, suite, model=served_model, api_key=api_key, progress=progress)
    if not run.observations:
        failed = sum(r.failed for r in run.runs)
        raise AutotuneError(
            f"calibration: no probe request to {base_url} succeeded ({failed} failed); "
            "is the server serving this model?"
        )
    cal = fit_twin(suite, run.observations, model, base, args, starts=starts)
    measured = measured_here(run.server.base_url, run.server.version, run.server.model_id)
    return LiveCalibration(run, cal, cal.spec(measured))


def profile_path(out: str | Path) -> Path:
    """Where the twin file will go, checked before any probe runs (a fit is not lost to a
    bad ``--out`` at the end): its folder is made, and it must be writable and not a
    folder itself. A ConfigError names the path and why."""
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {path} ({exc.strerror or exc})") from exc
    if path.is_dir():
        raise ConfigError(f"--out: {path} is a folder; give the profile file's path")
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--out: cannot write {path} (its folder is not writable)")
    return path


def write_profile(spec: TwinFile, out: str | Path) -> Path:
    """Write the twin file; returns its path. A ConfigError names the path and why not."""
    path = Path(out)
    try:
        path.write_text(dump_twin(spec))
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {path} ({exc.strerror or exc})") from exc
    return path
