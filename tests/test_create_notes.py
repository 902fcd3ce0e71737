"""What ``study create`` states about its workload before anything runs: the rows of a trace
it left out (how many, why), a baseline ``max_model_len`` that a handful of requests set, a
search range that excludes the baseline's value and a stage that cannot change anything
(autotune/workload/traces.py, autotune/tuning/search/plan.py; docs/tuning.md#8-the-staged-plan)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from autotune.cli import app
from autotune.tuning.search.plan import longest_candidate_warning


def test_longest_candidate_warning_needs_few_requests_and_a_far_candidate() -> None:
    prompt, output = [1000] * 399 + [30000], [100] * 399 + [1000]
    w = longest_candidate_warning((1280, 34560), prompt, output)
    assert w is not None
    assert w.startswith("max_model_len candidate 34560 is set by 1 of 400 requests (0.25 %)")
    assert "search.max_model_len.high: 1280" in w
    # an ordinary tail: the max is less than twice the next candidate
    assert longest_candidate_warning((1280, 2304), [*prompt[:399], 2000], output) is None
    # 1 % or more of the requests need it: it is the workload's, not an outlier's
    assert longest_candidate_warning((1280, 34560), [1000] * 99 + [30000], [100] * 100) is None
    assert longest_candidate_warning((34560,), prompt, output) is None


def test_create_states_dropped_rows_and_warns_of_an_outlier_baseline(tmp_path: Path) -> None:
    rows = [{"t": i * 0.5, "in": 600 + (i * 37) % 400, "out": 120} for i in range(398)]
    rows.append({"t": 199.0, "in": 30000, "out": 1000})  # one request sets the longest
    rows.append({"t": 199.5, "in": 500, "out": 0})  # a failed request in the trace
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "name": "t",
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "hardware": "A100-80GB",
        "worker": {"kind": "sim-virtual"},
        "workload": {
            "source": "trace",
            "path": str(trace),
            "columns": {"timestamp": "t", "input_length": "in", "output_length": "out"},
            "arrival": "trace",
        },
        "slo": {"p99_ttft_ms": 3000, "p99_tpot_ms": 45},
        "strategy": {"capacity_levels": 4},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(app, ["study", "create", "--config", str(path), "--storage", url])
    assert r.exit_code == 0, r.output
    assert "399 requests" in r.output
    assert "workload: 1 of 400 rows dropped: out 0" in r.output
    assert "warning: max_model_len candidate 34304 is set by 1 of 399 requests (0.25 %)" in (
        r.output.replace("\n", " ")
    )


def test_create_notes_a_range_that_excludes_the_baseline_and_a_stage_that_cannot_matter(
    tmp_path: Path,
) -> None:
    cfg = {
        "name": "t",
        "model": {"name": "autotune/tiny-llama"},
        "hardware": "test-4GB",  # vLLM's defaults there: max_num_seqs 256
        "worker": {"kind": "sim-virtual", "static_args": {"kv_cache_memory_bytes": 64 * 2**20}},
        "workload": {"num_prompts": 100, "input_len": 128, "output_len": 64, "rate": 10},
        "slo": {"p99_ttft_ms": 500, "p99_tpot_ms": 50},
        "search": {"max_num_seqs": {"low": 8, "high": 16}},
        "strategy": {"capacity_levels": 4, "n_trials": 10, "trials_per_stage": 2},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(app, ["study", "create", "--config", str(path), "--storage", url])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())  # the console wraps long lines
    assert (
        "note: search.max_num_seqs 8..16, set in the config, excludes the baseline's 256: the "
        "baseline still runs at 256; the max_num_seqs stages search 8..16 only"
    ) in out
    assert out.count("note:") == 1  # the other ranges reach the baseline's values
    assert (
        "gpu_memory_utilization 0 (skipped: worker.static_args.kv_cache_memory_bytes 67108864 "
        "fixes the KV cache's size, so gpu_memory_utilization changes nothing)"
    ) in out
