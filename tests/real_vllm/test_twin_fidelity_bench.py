"""``benchmarks/twin_fidelity.py --quick``: calibrate a twin on real vLLM (the tiny model),
predict one held-out config, and print the figures' keys. Its targets are for the full run
(docs/calibrate.md#5-prediction-on-real-vllm); this checks that the whole path (serve,
probe, fit, capacity burst, Poisson loads, the three predictors) completes on the real
server; and that ``benchmarks/twin_refit.py`` rebuilds the run from its work folder: its
refit with the default constants gives the run's own figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .support import REPO, TIMINGS

pytestmark = [pytest.mark.real_vllm]

BENCH = REPO / "benchmarks" / "twin_fidelity.py"
REFIT = REPO / "benchmarks" / "twin_refit.py"
KEYS = {
    "heldout_throughput_err_pct_max",
    "heldout_p50_ttft_err_pct_max",
    "heldout_p50_tpot_err_pct_max",
    "heldout_engine_itl_err_pct_max",
    "noise_band_pct",
    "constant_predictor_err_pct_max",
    "uncalibrated_err_pct_max",
    "heldout_configs",
}


def _bench(script: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Run a benchmark script; its stdout and its last line's JSON (timed in TIMINGS)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    TIMINGS[f"benchmarks/{script.name} --quick"] = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


def test_twin_fidelity_quick_completes_and_prints_its_keys(
    vllm_venv: Path, tiny_model: Path
) -> None:
    # the session's tiny model, not a second build of it (about 12 s of CI)
    stdout, out = _bench(BENCH, "--quick", "--venv", str(vllm_venv), "--model", str(tiny_model))
    assert set(out) >= KEYS, sorted(KEYS - set(out))
    assert out["heldout_configs"] == 1
    assert out["heldout_throughput_err_pct_max"] is not None  # a capacity was measured
    assert out["heldout_engine_itl_err_pct_max"] is not None  # the server's own gaps were read

    # the same run refitted offline from what it kept: the default fit is the run's own
    work = next(
        line.split(": ", 1)[1].rsplit("/", 1)[0]
        for line in stdout.splitlines()
        if line.startswith("measurements: ")
    )
    fits = _bench(REFIT, work, "--quick", "--also", "cost.t_req", "--skip", "burst:ttft")[1]
    fits = fits["fits"]
    assert list(fits) == ["default", "+cost.t_req -burst:ttft"]
    assert fits["default"]["twin_err_pct_max"] == out["twin_err_pct_max"]
    variant = fits["+cost.t_req -burst:ttft"]
    assert "cost.t_req" in variant["constants"]
    assert "cost.t_req" not in fits["default"]["constants"]
    # the second fit without the bursts' mean TTFTs (one a burst probe)
    assert 0 < fits["default"]["figures"] - variant["figures"] <= 2
