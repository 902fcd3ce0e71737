"""The workload-size estimate and its limit at `study create` (the accuracy target, within 2x
of a measurement at 100,000 prompts, is benchmarks/workload_size.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune import cli, sizing
from autotune.config import parse_config
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model

CFG = {
    "name": "sized",
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "hardware": "A100-80GB",
    "workload": {"num_prompts": 3000, "input_len": 256, "output_len": 32, "rate": 4},
    "slo": {"p99_ttft_ms": 3000},
    "strategy": {"n_trials": 1, "capacity_levels": 3},
}


def _estimate(n: int, **workload: object) -> sizing.SizeEstimate | None:
    d = {**CFG, "workload": {**CFG["workload"], "num_prompts": n, **workload}}
    cfg = parse_config(yaml.safe_dump(d))
    return sizing.estimate(cfg, get_model(cfg.model.name), get_hardware(cfg.hardware))


def test_small_workloads_are_not_sized_and_large_ones_scale_linearly() -> None:
    assert _estimate(sizing.SAMPLE) is None
    a, b = _estimate(100_000), _estimate(1_000_000)
    assert a is not None and b is not None
    base = sizing.resident_bytes()
    growth_a, growth_b = a.peak_bytes - base, b.peak_bytes - base
    assert 8 < growth_b / growth_a < 12  # the sample is the same: 10x the prompts
    assert a.create_levels == 1 + 3  # the peak-concurrency estimate and the capacity probe
    longer = _estimate(100_000, output_len=256)  # 8x the tokens per request
    assert longer is not None and longer.peak_bytes - base > 2 * growth_a
    assert "100,000 prompts need about" in a.describe()


def test_the_limit_refuses_and_the_flag_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sizing, "LIMIT_BYTES", 1e6)  # any workload is over 1 MB
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "s.yaml"
    config.write_text(yaml.safe_dump(CFG), encoding="utf-8")
    args = ["study", "create", "--config", str(config), "--storage", f"sqlite:///{tmp_path}/t.db"]
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1
    assert "workload.num_prompts: 3,000 prompts need about" in err and "--allow-large" in err
    assert not (tmp_path / "t.db").exists()  # refused before the database was opened
    with pytest.raises(SystemExit) as info:
        cli.main([*args, "--allow-large-workload"])
    out = capsys.readouterr().out
    assert info.value.code in (0, None)
    assert "workload: 3,000 prompts need about" in out and "study 'sized' created" in out
