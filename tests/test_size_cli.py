"""``autotune size`` end to end on the simulator (docs/sizing.md): the table's rows, its
documented JSON schema, the replicated check's figures within the SLOs, prices only from the
user, the HTML page, and bad input as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support.cli_main import run_main
from support.studies import BASE

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "size.schema.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("size") / "tiny.yaml"
    p.write_text(yaml.safe_dump(BASE))
    return p


def size(tiny: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    args = ["size", "--config", str(tiny), "--trials", "3", "--gpus-per-node", "2", *extra]
    return run_main(args, capsys)


def test_a_rate_target_gives_ranked_priced_rows_that_meet_the_slos(
    tiny: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "size.html"
    code, out, _ = size(
        tiny,
        capsys,
        "--target-rate",
        "30",
        "--price",
        "A100-80GB=1.5",
        "--json",
        "--html",
        str(page),
    )
    assert code == 0
    d: dict[str, Any] = json.loads(out)
    jsonschema.validate(d, SCHEMA)
    assert d["target"] == {"kind": "rate", "value": 30.0} and d["ranked_by"] == "cost"
    rows = d["rows"]
    assert sorted(r["tensor_parallel_size"] for r in rows) == [1, 2]  # 2 GPUs per node
    slo = BASE["slo"]
    for r in rows:
        assert r["failure"] is None and r["check"] in ("holds", "conservative")
        assert r["gpus"] == r["replicas"] * r["tensor_parallel_size"]
        # the arithmetic's count, or a count the check raised
        assert r["replicas"] * r["per_replica"] >= 30.0 or "raised from" in r["check_text"]
        assert r["p99_ttft_ms"] <= slo["p99_ttft_ms"] and r["p99_tpot_ms"] <= slo["p99_tpot_ms"]
        assert r["cost_per_hour"] == pytest.approx(1.5 * r["gpus"])
        per_1m = r["cost_per_hour"] / (r["output_tps"] * 3600) * 1e6
        assert r["cost_per_1m_output_tokens"] == pytest.approx(per_1m)
        assert f"--tensor-parallel-size {r['tensor_parallel_size']}" in r["command"]
    costs = [r["cost_per_hour"] for r in rows]
    assert costs == sorted(costs)
    assert d["winner"] == {"row": 0, "command": rows[0]["command"]}
    text = page.read_text()
    # one element with the plot's id: plotly draws into the first element that has it
    assert text.count('id="pareto"') == 1
    assert re.search(r'Plotly\.newPlot\(\s*"pareto"', text)
    assert rows[0]["command"] in text and "A100-80GB" in text


def test_without_prices_there_is_no_cost_and_the_table_prints(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = size(tiny, capsys, "--target-concurrency", "24")
    assert code == 0
    assert "ranked by gpus" in out and "winner: A100-80GB" in out and "vllm serve" in out
    assert "per replica (streams)" in out
    assert "A100-80GB TP 1:" in err  # progress, one line per candidate


def test_a_real_worker_measures_only_the_tp_sizes_this_host_can_launch(
    tiny: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--worker vllm on a host without a GPU: TP 1 only, said on stderr, before any launch
    (the real launch is docs/sizing.md#9-on-real-workers's measured run)."""
    import autotune.cli.size as cli_size
    from autotune.workers.gpu_discovery import NoGpuError

    def no_gpu() -> None:
        raise NoGpuError("no GPU found: nvidia-smi is not on PATH")

    seen: list[int] = []

    def fake_size(*args: Any, devices_per_node: int, **kw: Any) -> None:
        seen.append(devices_per_node)
        raise SystemExit(0)

    monkeypatch.setattr(cli_size, "find_gpus", no_gpu)
    monkeypatch.setattr(cli_size, "size_deployment", fake_size)
    code, _, err = size(tiny, capsys, "--target-rate", "3", "--worker", "vllm")
    assert code == 0 and seen == [1]
    assert "--worker vllm: TP sizes up to 1 (no GPU found" in err


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--target-rate", "3", "--target-concurrency", "4"], "exactly one of"),
        ([], "exactly one of"),
        (["--target-rate", "3", "--price", "H100=2"], "unknown hardware profile 'H100'"),
        (["--target-concurrency", "0"], "positive"),
    ],
)
def test_bad_input_is_one_line(
    tiny: Path, capsys: pytest.CaptureFixture[str], extra: list[str], why: str
) -> None:
    code, out, err = size(tiny, capsys, *extra)
    assert code in (1, 2) and why in err and out == ""
