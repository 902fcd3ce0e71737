"""Drift detection on constructed profiles (autotune.nightly.drift), and the nightly
config's one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from autotune.errors import ConfigError
from autotune.nightly.drift import TrafficProfile, detect_drift, traffic_profile
from autotune.nightly.job_config import DriftConfig, load_nightly_config
from autotune.nightly.warmstart import project, widen_for
from autotune.tuning.search.space import SpaceBounds

TH = DriftConfig()


def lognormal_profile(
    median: float, *, rate: float = 4.0, n: int = 4000, seed: int = 0
) -> TrafficProfile:
    rng = np.random.default_rng(seed)
    prompt = np.round(rng.lognormal(np.log(median), 0.5, n))
    output = np.round(rng.lognormal(np.log(128), 0.5, n))
    return traffic_profile(prompt, output, rate)


def test_share_over_matches_the_requests() -> None:
    rng = np.random.default_rng(3)
    prompt, output = rng.lognormal(7.0, 0.6, 5000), rng.lognormal(5.0, 0.5, 5000)
    prof = traffic_profile(prompt, output, None)
    total = prompt + output
    for length in (800, 1500, 2500, 4000):
        assert prof.share_over(length) == pytest.approx(np.mean(total > length), abs=0.003)
    assert prof.share_over(int(total.max()) + 1) == 0.0
    assert prof.share_over(0) == 1.0


def test_same_traffic_new_sample_is_no_drift() -> None:
    old, new = lognormal_profile(1000, seed=1), lognormal_profile(1000, seed=2)
    d = detect_drift(old, new, [2048, 4096], TH)
    assert not d.drifted and not d.first_run, d.reasons
    assert abs(d.figures["prompt_p50"]["change_pct"] or 0) < 5
    assert set(d.share_over) == {2048, 4096}


def test_prompts_twice_as_long_drift_in_lengths_and_share_over() -> None:
    old, new = lognormal_profile(1000, seed=1), lognormal_profile(2000, seed=2)
    d = detect_drift(old, new, [2048, 4096], TH)
    assert d.drifted
    assert d.figures["prompt_p50"]["change_pct"] == pytest.approx(100, abs=8)
    assert any(r.startswith("prompt_p50") for r in d.reasons)
    assert any("share over max_model_len 4096" in r for r in d.reasons)
    assert d.share_over[4096]["new"] > d.share_over[4096]["old"] + 0.03
    assert not any(r.startswith("output_") for r in d.reasons)


def test_rate_change_alone_is_drift_and_its_threshold_counts() -> None:
    old, new = lognormal_profile(1000, rate=4.0), lognormal_profile(1000, rate=6.0)
    d = detect_drift(old, new, [4096], TH)
    assert d.drifted and d.reasons == ("rate 4.00 -> 6.00 req/s (+50.0 %)",)
    loose = detect_drift(old, new, [4096], DriftConfig(rate_pct=60))
    assert not loose.drifted


def test_first_run_has_todays_figures_and_no_drift() -> None:
    d = detect_drift(None, lognormal_profile(1000), [4096], TH)
    assert d.first_run and not d.drifted
    assert d.figures["prompt_p50"]["new"] == pytest.approx(1000, rel=0.05)
    assert TrafficProfile.from_dict(lognormal_profile(1000).to_dict()) == lognormal_profile(1000)


def test_projection_into_todays_space_is_recorded() -> None:
    b = SpaceBounds((2048, 4096), util_low=0.8, util_high=0.95, mns_low=8, mns_high=128)
    p = project(
        {
            "max_model_len": 3000,
            "gpu_memory_utilization": 0.97,
            "max_num_seqs": 256,
            "max_num_batched_tokens": 100,
        },
        b,
        "warm",
    )
    assert p.after == {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.95,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 256,
    }
    assert p.changed == list(p.after)
    wide = widen_for(b, {**p.before, "max_num_batched_tokens": 100})
    assert 3000 in wide.max_model_len_candidates and wide.mns_high == 256
    assert wide.util_high == 0.97 and wide.mnbt_low == 100


def test_config_errors_name_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "n.yaml"
    bad.write_text(
        "deployment: chat\ntraffic:\n  source: traces\nmodel: {name: m}\nhardware: h\n"
        "slo: {p99_ttft_ms: 100}\noutput: o.yaml\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_nightly_config(bad)
    assert str(info.value).startswith(f"{bad}:2: traffic: source 'traces' needs 'dir'")
    bad.write_text(
        "deployment: chat\ntraffic: {dir: t, columns: {a: b}}\nmodel: {name: m}\nhardware: h\n"
        "slo: {p99_ttft_ms: 100}\noutput: o.yaml\nincumbent:\n  max_num_seqs: -1\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_nightly_config(bad)
    assert str(info.value) == (
        f"{bad}:7: incumbent: max_num_seqs: must be a positive integer, got -1"
    )
    assert "\n" not in str(info.value)


def test_the_deployment_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).parents[1] / "configs"
    monkeypatch.setenv("AUTOTUNE_TRACE_DIR", "/tmp")
    cfg = load_nightly_config(root / "nightly-chat.yaml")
    assert cfg.deployment == "chat-prod" and cfg.min_gain_pct == 2
    deploy = root / "deploy"
    cronjob = root.parent / "deploy" / "k8s" / "nightly-cronjob.yaml"  # with the k8s manifests
    for path in (deploy / "crontab", deploy / "autotune-nightly.service", cronjob):
        assert "autotune nightly --config" in path.read_text(encoding="utf-8")
    timer = (deploy / "autotune-nightly.timer").read_text(encoding="utf-8")
    assert "OnCalendar=*-*-* 02:00:00 UTC" in timer and "Persistent=true" in timer
    job = yaml.safe_load(cronjob.read_text(encoding="utf-8"))
    assert job["kind"] == "CronJob" and job["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["spec"]["schedule"] == "0 2 * * *"
