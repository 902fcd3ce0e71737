"""The simulator accuracy benchmark's rows (benchmarks/sim_accuracy.py,
benchmarks/data/sim_accuracy/): every published row's parameters reach the simulator as
written, and the held-out/fit split follows its rule; the table it ships and the line a
study planned on the simulator states."""

from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.profiles.hardware import get_hardware
from autotune.sim import EngineArgs, planning_error
from autotune.sim.accuracy import AccuracyGroup, AccuracyTable, gpu_class

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sim_accuracy
from sim_accuracy import DATA, PACED_S, Row, model_of, read_rows, replay, requests_of

with (DATA / "rows.csv").open(newline="") as _f:
    RAW = list(csv.DictReader(_f))
ROWS = read_rows(DATA / "rows.csv")


class _Reached(Exception):
    """Raised by the spy in place of a replay: the arguments reached the simulator."""


@pytest.mark.parametrize("raw,row", list(zip(RAW, ROWS, strict=True)), ids=[r.id for r in ROWS])
def test_each_rows_parameters_reach_the_simulator_as_written(
    raw: dict[str, str], row: Row, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def spy(model: Any, hw: Any, args: EngineArgs, reqs: Any, **kw: Any) -> Any:
        seen.update(model=model, hw=hw, args=args, reqs=reqs, **kw)
        raise _Reached

    monkeypatch.setattr(sim_accuracy, "simulate", spy)
    if not raw["input_len"] or not raw["output_len"]:
        assert replay(row) == "lengths not published" and not seen
        return
    if raw["gpu"] == "RTX-4090":
        assert replay(row) == "no GPU profile for RTX-4090" and not seen
        return
    with pytest.raises(_Reached):
        replay(row)
    assert seen["hw"] == get_hardware(raw["gpu"])
    assert seen["model"].name.split("/")[-1] == raw["model"].split("/")[-1]
    args: EngineArgs = seen["args"]
    assert args.tensor_parallel_size == int(raw["tp"])
    for k, v in (Row.of(raw).engine_args or {}).items():
        assert getattr(args, k) == v
    reqs = seen["reqs"]
    n = int(PACED_S * float(raw["rate"])) if raw["kind"] == "paced" else int(raw["prompts"])
    assert len(reqs) == n
    # the mean lengths as published (lognormal draws within 10 %; random runs exact)
    for attr, col in (("prompt_len", "input_len"), ("output_len", "output_len")):
        mean = sum(getattr(q, attr) for q in reqs) / n
        assert mean == pytest.approx(float(raw[col]), rel=0.1 if raw["dataset"] != "random" else 0)
    arrivals = [q.arrival for q in reqs]
    if raw["kind"] == "paced":
        assert arrivals[1] - arrivals[0] == pytest.approx(1 / float(raw["rate"]))
    elif raw["kind"] == "poisson":  # exponential gaps at the row's rate
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert min(gaps) >= 0 and len(set(gaps)) > n // 2
        assert n / arrivals[-1] == pytest.approx(float(raw["rate"]), rel=0.25)
    else:
        assert set(arrivals) == {0.0}
    assert seen["concurrency"] == (int(raw["concurrency"]) if raw["concurrency"] else None)


def test_the_split_holds_out_gpustack_and_every_gpu_but_h100() -> None:
    for r in RAW:
        held = r["source"] == "gpustack/gpustack" or r["gpu"] != "H100-80GB"
        assert r["split"] == ("heldout" if held else "fit"), r["id"]
    assert sum(r["split"] == "fit" for r in RAW) <= sum(r["split"] == "heldout" for r in RAW)


def test_models_without_a_builtin_profile_come_from_their_published_config() -> None:
    # published parameter counts: Qwen3-8B 8.2 B, Qwen3-14B 14.8 B, Qwen3-32B 32.8 B
    for name, params in (
        ("Qwen/Qwen3-8B", 8.2),
        ("Qwen/Qwen3-14B", 14.8),
        ("Qwen/Qwen3-32B", 32.8),
    ):
        m = model_of(name)
        assert m.head_dim == 128 and round(m.num_params / 1e9, 1) == params
    assert requests_of(ROWS[0])  # a closed-loop row's requests are drawn


# -- the shipped table and the line a study states -------------------------------------------


def test_the_shipped_table_is_this_engines_and_matches_a_fresh_run() -> None:
    """autotune/sim/accuracy.json is regenerated with `python benchmarks/sim_accuracy.py
    --write` whenever the engine changes (its fingerprint) or the rows do."""
    from sim_accuracy import shipped_table

    from autotune.sim import accuracy_table
    from autotune.sim.version import engine_fingerprint

    shipped = accuracy_table()
    assert shipped.fingerprint == engine_fingerprint(), (
        "the engine changed: run python benchmarks/sim_accuracy.py --write"
    )
    pred = {r.id: got for r in ROWS if not isinstance(got := replay(r), str)}
    assert shipped_table(ROWS, pred) == shipped


def _group(cls: str | None, bursts: bool, rows: int, tput: float) -> AccuracyGroup:
    return AccuracyGroup(cls, bursts, rows, tput, 50.0, 7.0, None)


TABLE = AccuracyTable(
    "x",
    (
        _group("H100", False, 4, 10.2),
        _group("H100", True, 2, 88.0),
        _group("A100", True, 6, 52.0),
        _group(None, False, 4, 10.2),
    ),
)


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        (
            "H100-80GB",
            "planned on the simulator: its throughput error is ±10 % on held-out H100 "
            "measurements (4 rows; mean TPOT ±7 %; mean TTFT ±50 %)",
        ),
        (
            "A100-40GB",  # a class with bursts only: those, and the steady rows beside
            "planned on the simulator: its throughput error is ±52 % on held-out A100 "
            "measurements (6 rows, all bursts; mean TPOT ±7 %; mean TTFT ±50 %); under "
            "steady load, on all held-out measurements, its throughput error is ±10 % "
            "(4 rows; mean TPOT ±7 %; mean TTFT ±50 %)",
        ),
        (
            "L4",
            "planned on the simulator: no held-out measurement on L4; on all held-out "
            "measurements its throughput error is ±10 % (4 rows; mean TPOT ±7 %; "
            "mean TTFT ±50 %)",
        ),
    ],
)
def test_the_line_names_the_closest_held_out_rows(hardware: str, expected: str) -> None:
    assert planning_error(hardware, TABLE).text() == expected
    assert planning_error(hardware, TABLE).own_class == ("L4" not in hardware)


def test_no_held_out_row_at_all_is_said() -> None:
    empty = AccuracyTable("x", ())
    assert planning_error("H100-80GB", empty).text() == (
        "planned on the simulator: its error was not measured (no held-out measurement)"
    )
    assert gpu_class("A100-80GB") == gpu_class("A100-40GB") == "A100"
    assert gpu_class("RTX-4090") == "RTX-4090"


def test_the_bounds_sweep_moves_only_the_constant_it_names() -> None:
    """benchmarks/sim_accuracy_bounds.py: a larger API-server cost per request lengthens a
    lone request's TTFT by about the difference and leaves its decode alone; a larger
    all-reduce latency lengthens a tensor-parallel row's TPOT and leaves a TP 1 row's as it
    was."""
    import sim_accuracy_bounds as bounds

    by_id = {r.id: r for r in ROWS}
    lone, tp8 = by_id["gpustack-qwen3-8b-h100-c1"], by_id["suraj-llama33-70b-a100-40g-tp8-qps1"]
    base = bounds.predict([lone], bounds.per_request(0.0055))[lone.id]
    slow = bounds.predict([lone], bounds.per_request(0.0255))[lone.id]
    assert slow["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(20.0, abs=2.0)
    assert slow["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"], rel=0.02)
    near, far = (bounds.predict([lone, tp8], bounds.allreduce(s)) for s in (10e-6, 40e-6))
    assert far[lone.id] == near[lone.id]
    # 160 all-reduces a step (two per layer, 80 layers) at 30 us more: about 4.8 ms a token
    assert far[tp8.id]["mean_tpot_ms"] - near[tp8.id]["mean_tpot_ms"] == pytest.approx(4.8, rel=0.2)
