"""``benchmarks/real_study.py --quick``: a slo-capacity study on real vLLM re-measured with
``vllm bench serve``. The figures are not fixed (a loaded host moves them); what is checked is
that its JSON line agrees with itself and with the study it stored: each run's verdict follows
from its p99s and the SLOs, the counts and the share follow from the runs, and the claimed
rates are the capacities the study stored, times the workload's rate."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.config import parse_config
from autotune.report.bounds import trial_capacity
from autotune.store import Store
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.study_attrs import read_noise

from .conftest import in_ci
from .support import REPO, TIMINGS

# Not in CI (`-m "real_vllm and not bench"` there): a measurement, minutes long, and on a
# two-core host that also runs the server it is often stopped as client-limited in its noise
# re-runs (measured here: the search's level at 8 req/s had a median send lag of 0.2 ms, its
# two re-runs 0.6 and 35 ms and a median read gap of 0), which says nothing of autotune
pytestmark = [pytest.mark.real_vllm, pytest.mark.bench]

BENCH = REPO / "benchmarks" / "real_study.py"


def held(run: dict[str, Any], slo: dict[str, float]) -> bool:
    return bool(
        run["failed"] == 0
        and run["p99_ttft_ms"] <= slo["p99_ttft_ms"]
        and run["p99_tpot_ms"] <= slo["p99_tpot_ms"]
    )


def test_real_study_quick_reports_what_it_measured(vllm_venv: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    args = ["--quick", "--venv", str(vllm_venv), "--workdir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    TIMINGS["benchmarks/real_study.py --quick"] = time.monotonic() - t0
    last = proc.stdout.strip().splitlines()[-1:] or ["{}"]
    out = json.loads(last[0]) if last[0].startswith("{") else {}
    if proc.returncode == 3 and "client_limited" in out:
        # the study stopped because this host could not drive even the lowest loads; on a
        # host busy with other work (load average above its CPU count) that says nothing
        # about autotune, anywhere else (and always in CI) it is a failure
        busy = out["load_avg"]["during_max"] > (os.cpu_count() or 1)
        if busy and not in_ci():
            pytest.skip(f"host too busy to drive the load: {out['client_limited']}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["bench"] == "real_study" and out["quick"] is True
    slo = out["slo"]
    claims = out["claims"]
    assert claims and claims[0]["label"] == "baseline"
    assert 0 < out["study_wall_s"] < out["total_wall_s"]
    for c in claims:
        runs_at, runs_above = c["runs_at"], c["runs_above"]
        assert len(runs_at) == len(runs_above) == 1  # --quick: one run per config and rate
        for r in runs_at + runs_above:
            assert r["held"] is held(r, slo)
            assert r["completed"] > 0
        assert all(math.isclose(r["rate_rps"], c["claimed_rps"], rel_tol=1e-6) for r in runs_at)
        assert all(math.isclose(r["rate_rps"], c["above_rps"], rel_tol=1e-6) for r in runs_above)
        assert c["above_rps"] > c["claimed_rps"] > 0
        assert c["held_at"] == sum(r["held"] for r in runs_at)
        assert c["failed_above"] == sum(not r["held"] for r in runs_above)
        if c["status"] not in ("at_top", "below_low"):  # an exact claim: holds, next fails
            assert c["reproduced"] is (c["held_at"] == 1 and c["failed_above"] == 1)
    share = sum(c["reproduced"] for c in claims) / len(claims)
    assert out["claims_reproduced"] == round(share, 3)
    loads = out["load_avg"]
    assert set(loads) == {"before", "during_mean", "during_max", "after"}
    assert 0 <= loads["during_mean"] <= loads["during_max"]

    # the claims are the study's stored capacities; the noise band is its stored record
    text = (tmp_path / "study.yaml").read_text()
    cfg = parse_config(text, "study.yaml")
    assert yaml.safe_load(text)["worker"]["kind"] == "vllm"
    with Store.open(f"sqlite:///{tmp_path}/study.db") as store:
        trials = {t.optuna_trial_number: t for t in store.trials(cfg.name)}
        study = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
        noise = read_noise(study)
    assert trials[claims[0]["trial"]].stage == "baseline"
    for c in claims:
        t = trials[c["trial"]]
        assert t.launch_argv is not None and t.launch_argv[1] == "serve"
        assert c["engine_args"] == t.engine_args
        if c["source"] == "study":
            cap = trial_capacity(t, lattice_of(cfg), cfg.mode)
            assert cap is not None and cap.scale is not None and cfg.workload.rate is not None
            assert math.isclose(c["claimed_rps"], cap.scale * cfg.workload.rate, rel_tol=1e-3)
    if noise is None:
        assert out["noise_band_pct"] is None
    else:
        assert out["noise_band_pct"] == round(noise.band_pct, 2)
