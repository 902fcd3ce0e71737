"""``study export --format llmd-report`` (autotune/report/llmd_report.py,
docs/report.md#8-per-request-exports): each level of a trial as an llm-d benchmark report
v0.2, checked against the constraints of that schema (tests/data/, restated from
llm-d-benchmark's), with its figures those the level was stored with, from the per-request
records when the study kept them and from the stored summary when not."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.cli_main import run_main
from support.recorded_study import stored_trial

from autotune.loadgen.stopped import StopInfo
from autotune.store import LevelRecord

SCHEMA = json.loads(
    (Path(__file__).parent / "data" / "llmd_benchmark_report_v0_2.schema.json").read_text()
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def reports(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> dict[str, Any]:
    code, out, err = run_main(
        ["study", "export", "t", "--format", "llmd-report", "--storage", url, *args], capsys
    )
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def latency(doc: dict[str, Any]) -> dict[str, Any]:
    lat: dict[str, Any] = doc["results"]["request_performance"]["aggregate"]["latency"]
    return lat


def test_the_schema_refuses_what_v0_2_refuses() -> None:
    good: dict[str, Any] = {
        "version": "0.2",
        "run": {"uid": "u"},
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": {"total": 3},
                    "latency": {"time_to_first_token": {"units": "s", "mean": 0.1}},
                }
            }
        },
    }
    VALIDATOR.validate(good)
    for path, value in (
        (("run",), {}),  # no uid
        (("results", "request_performance", "aggregate", "requests", "total"), -1),
        (("results", "request_performance", "aggregate", "latency", "ttft"), {}),  # a typo
        (
            ("results", "request_performance", "aggregate", "latency", "time_to_first_token"),
            {"units": "seconds", "mean": 0.1},
        ),
    ):
        bad = copy.deepcopy(good)
        at = bad
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
        assert not VALIDATOR.is_valid(bad), path


def test_each_level_is_a_report_with_the_figures_it_was_stored_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, levels = asyncio.run(stored_trial(tmp_path, keep=True))
    top = max((lv for lv in levels.values() if lv.feasible), key=lambda lv: lv.scale)
    doc = reports(capsys, url)  # the recommended trial's capacity level
    VALIDATOR.validate(doc)
    assert doc["version"] == "0.2" and doc == reports(capsys, url)  # the same level, the same uid
    load = doc["scenario"]["load"]["standardized"]
    assert load["stage"] == top.level_index and load["rate_qps"] == pytest.approx(top.offered_rate)
    engine = doc["scenario"]["stack"][0]["standardized"]
    assert engine["tool"] == "autotune-sim" and engine["accelerator"]["model"] == "A100-80GB"
    assert doc["scenario"]["stack"][0]["native"]["args"]["--max-num-seqs"] == 16
    agg = doc["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == top.completed + top.failed
    lat = latency(doc)
    # from the records: every percentile, and the same p99s the level was scored on
    assert lat["time_to_first_token"]["p99"] * 1000 == pytest.approx(top.p99_ttft_ms, abs=1e-6)
    assert lat["time_per_output_token"]["p99"] * 1000 == pytest.approx(top.p99_tpot_ms, abs=1e-6)
    assert lat["inter_token_latency"]["p99"] * 1000 == pytest.approx(top.p99_itl_ms, abs=1e-6)
    assert {"min", "p0p1", "p25", "max"} <= set(lat["request_latency"])
    assert "normalized_time_per_output_token" in lat
    rate = agg["throughput"]["output_token_rate"]
    assert rate == {"units": "tokens/s", "mean": pytest.approx(top.output_throughput)}
    # every level, one file each, each a stage of one experiment
    folder = tmp_path / "reports"
    code, _, err = run_main(
        ["study", "export", "t", "--format", "llmd-report", "--level", "all", "--out",
         str(folder), "--storage", url], capsys,
    )  # fmt: skip
    assert code == 0, err
    docs = [json.loads(p.read_text()) for p in sorted(folder.iterdir())]
    assert len(docs) == len(levels)
    for d in docs:
        VALIDATOR.validate(d)
    assert sorted(d["scenario"]["load"]["standardized"]["stage"] for d in docs) == sorted(levels)
    assert len({d["run"]["uid"] for d in docs}) == len(docs)
    assert len({d["run"]["eid"] for d in docs}) == 1


def test_without_records_a_report_holds_the_stored_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, levels = asyncio.run(stored_trial(tmp_path, keep=False))
    low: LevelRecord = min(levels.values(), key=lambda lv: lv.scale)
    doc = reports(capsys, url, "--trial", "0", "--level", str(low.level_index))
    VALIDATOR.validate(doc)
    lat = latency(doc)
    assert lat["time_to_first_token"]["p99"] * 1000 == pytest.approx(low.p99_ttft_ms)
    assert lat["time_per_output_token"]["p99"] * 1000 == pytest.approx(low.p99_tpot_ms)
    # what only the records give is left out, not made up
    assert "normalized_time_per_output_token" not in lat
    assert "min" not in lat["time_to_first_token"]
    total = doc["results"]["request_performance"]["aggregate"]["requests"]["total"]
    assert total == low.completed + low.failed
    # a level the early-stop rule ended: the requests it never finished are incomplete, and
    # the latency it restated as lower bounds is left out rather than shown as a figure
    names = {"ttft": "time_to_first_token", "tpot": "time_per_output_token"}
    stops = {k: StopInfo.of(lv.metrics) for k, lv in levels.items()}
    stopped = {k: stop for k, stop in stops.items() if stop is not None and stop.bound}
    assert stopped  # the study's top load breaks its SLOs early
    for k, stop in stopped.items():
        doc = reports(capsys, url, "--level", str(k))
        VALIDATOR.validate(doc)
        requests = doc["results"]["request_performance"]["aggregate"]["requests"]
        assert requests["incomplete"] == stop.planned - requests["total"] > 0
        assert stop.bound is not None and names[stop.bound] not in latency(doc)
