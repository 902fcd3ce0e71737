"""``benchmarks/twin_fidelity.py --quick``: calibrate a twin on real vLLM (the tiny model),
predict one held-out config, and print the figures' keys. Its targets are for the full run
(docs/calibrate.md#5-prediction-on-real-vllm); this checks that the whole path (serve,
probe, fit, capacity burst, Poisson loads, the three predictors) completes on the real
server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .support import REPO, TIMINGS

pytestmark = [pytest.mark.real_vllm]

BENCH = REPO / "benchmarks" / "twin_fidelity.py"
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


def test_twin_fidelity_quick_completes_and_prints_its_keys(vllm_venv: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--venv", str(vllm_venv)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    TIMINGS["benchmarks/twin_fidelity.py --quick"] = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) >= KEYS, sorted(KEYS - set(out))
    assert out["heldout_configs"] == 1
    assert out["heldout_throughput_err_pct_max"] is not None  # a capacity was measured
    assert out["heldout_engine_itl_err_pct_max"] is not None  # the server's own gaps were read
