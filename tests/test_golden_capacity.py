"""The tuning-quality benchmark's cached ground truth still describes this simulator.

``benchmarks/data/tuning_quality_truth.json`` is keyed by the engine's fingerprint (its
constants and ``ENGINE_MODEL_VERSION``, docs/tuning.md#6-the-tuning-quality-benchmark) and
holds two golden configs measured with the ground-truth protocol. Re-measured here, they must
come out the same: if they moved while the fingerprint did not, the engine's behaviour
changed without a version bump, and every cached ground-truth figure is suspect.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from autotune.config import parse_config
from autotune.sim import version
from autotune.sim.version import engine_constants, engine_fingerprint
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.protocol import GROUND_TRUTH, measure_config

CACHE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "tuning_quality_truth.json"
REFRESH = "python benchmarks/tuning_quality.py --refresh-truth"


def test_fingerprint_covers_constants_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = engine_fingerprint()
    assert engine_constants()["costs"]["t_fixed"] > 0
    monkeypatch.setattr(version, "ENGINE_MODEL_VERSION", version.ENGINE_MODEL_VERSION + 1)
    assert engine_fingerprint() != before
    monkeypatch.undo()
    from autotune.sim import costs

    monkeypatch.setattr(costs, "DEFAULT_T_FIXED", costs.DEFAULT_T_FIXED * 1.01)
    assert engine_fingerprint() != before


def test_golden_capacities_match_the_cached_ground_truth() -> None:
    data = json.loads(CACHE.read_text())
    assert data["fingerprint"] == engine_fingerprint(), (
        "the simulator's constants or ENGINE_MODEL_VERSION changed: the cached ground truth "
        f"is stale; regenerate it with `{REFRESH}`"
    )
    assert data["protocol"] == asdict(GROUND_TRUTH), (
        f"the ground-truth protocol changed: regenerate the cache with `{REFRESH}`"
    )
    golden = data["golden"]
    assert len(golden) >= 2
    for g in golden:
        cfg = parse_config(yaml.safe_dump(g["config"]), "<golden>")
        m = asyncio.run(measure_config(cfg, g["engine_args"], GROUND_TRUTH))
        assert (m.capacity_scale, m.levels) == (g["capacity_scale"], g["levels"]), (
            f"golden config {g['engine_args']} now measures {m.objective:.3f} tok/s at "
            f"x{m.capacity_scale}, cached {g['objective']:.3f} at x{g['capacity_scale']}: "
            "the engine's behaviour changed without a bump of ENGINE_MODEL_VERSION "
            f"(autotune/sim/version.py); bump it and run `{REFRESH}`"
        )
        assert m.objective == pytest.approx(g["objective"], rel=1e-9, abs=1e-9)


def test_every_default_study_load_is_a_ground_truth_load() -> None:
    """Half steps: the ground-truth lattice refines the study's default one exactly."""
    study = Lattice(0.25, 8.0, 0.01)
    truth = Lattice(0.25, 8.0, GROUND_TRUTH.resolution)
    assert truth.top // 2 == study.top
    for k in range(study.top + 1):
        assert truth.scale(2 * k) == pytest.approx(study.scale(k), rel=1e-12)
    assert 0.00498 < GROUND_TRUTH.resolution < 0.005
