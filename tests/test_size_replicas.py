"""The replica arithmetic and the replicated check on a scripted runner, the table's costs and
ranking, and prices that come only from the user (docs/sizing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.studies import config

from autotune.errors import ConfigError
from autotune.planning import (
    DeploymentRun,
    Target,
    check_replicas,
    parse_price_flags,
    read_prices,
    replicas_needed_for,
    split_load,
)
from autotune.planning.candidate_study import CandidateResult
from autotune.planning.size_table import build_row, rank_rows


def test_replicas_needed_is_the_ceiling_of_target_over_capacity() -> None:
    rate = Target("rate", 100.0)
    assert replicas_needed_for(rate, 30.0) == 4
    assert replicas_needed_for(rate, 25.0) == 4  # exactly a quarter each: no fifth
    assert replicas_needed_for(rate, 500.0) == 1
    assert replicas_needed_for(Target("concurrency", 300), 165) == 2
    with pytest.raises(ValueError, match="positive"):
        replicas_needed_for(rate, 0.0)
    with pytest.raises(ValueError, match="whole number"):
        Target("concurrency", 2.5)


def test_the_load_is_split_without_losing_a_request() -> None:
    assert split_load(Target("rate", 10.0), 4) == [2.5] * 4
    streams = split_load(Target("concurrency", 300), 7)
    assert sum(streams) == 300 and max(streams) - min(streams) == 1
    with pytest.raises(ValueError, match="cannot share"):
        split_load(Target("concurrency", 3), 4)


def scripted(meets_from: int, calls: list[int]) -> object:
    """A deployment that meets the SLOs from ``meets_from`` replicas up."""

    def run(n: int) -> DeploymentRun:
        calls.append(n)
        ok = n >= meets_from
        return DeploymentRun(n, ok, 100.0, 10.0, 50.0 * n, 20.0, () if ok else ("p99 TTFT",))

    return run


def test_n_meets_and_n_minus_one_does_not() -> None:
    calls: list[int] = []
    c = check_replicas(4, scripted(4, calls))  # type: ignore[arg-type]
    assert (c.verdict, c.replicas, calls) == ("holds", 4, [4, 3])
    assert c.text == "holds: 4 replicas meet the SLOs, 3 do not"


def test_n_minus_one_also_meeting_is_conservative() -> None:
    c = check_replicas(4, scripted(2, []))  # type: ignore[arg-type]
    assert c.verdict == "conservative" and c.replicas == 4
    assert c.text.startswith("conservative: 3 replicas also meet")


def test_a_count_that_misses_is_raised_and_says_so() -> None:
    calls: list[int] = []
    c = check_replicas(3, scripted(5, calls))  # type: ignore[arg-type]
    assert (c.verdict, c.replicas, c.first) == ("holds", 5, 3)
    assert calls == [3, 4, 5]  # n - 1 = 4 was already run: not run twice
    assert "raised from 3" in c.text


def test_a_count_far_off_fails_and_one_replica_has_no_n_minus_one() -> None:
    c = check_replicas(1, scripted(9, []))  # type: ignore[arg-type]
    assert c.verdict == "fails" and c.replicas == 4 and "p99 TTFT" in c.text
    one = check_replicas(1, scripted(1, []))  # type: ignore[arg-type]
    assert one.below is None and one.text == "holds: 1 replica meets the SLOs"
    # a concurrency target of 2 streams cannot be split into 3 replicas
    capped = check_replicas(1, scripted(9, []), max_replicas=2)  # type: ignore[arg-type]
    assert capped.replicas == 2 and capped.verdict == "fails"


def test_costs_come_from_the_user_and_rank_the_rows() -> None:
    prices = {"H100-80GB": 2.5, "A100-80GB": 1.0}
    h = build_row(
        CandidateResult("H100-80GB", 2, "h", config()[0], engine_args={}, command="c"),
        10.0,
        check_replicas(2, scripted(2, [])),  # type: ignore[arg-type]
        prices,
    )
    a = build_row(
        CandidateResult("A100-80GB", 1, "a", config()[0], engine_args={}, command="c"),
        10.0,
        check_replicas(3, scripted(3, [])),  # type: ignore[arg-type]
        prices,
    )
    assert (h.gpus, h.cost_per_hour) == (4, 10.0)
    # 100 output tok/s for an hour: 360,000 tokens for $10
    assert h.cost_per_1m_output_tokens == pytest.approx(10.0 / (100.0 * 3600) * 1e6)
    assert (a.gpus, a.cost_per_hour) == (3, 3.0)
    ranked, by = rank_rows([h, a])
    assert by == "cost" and ranked[0] is a
    # no prices: no cost anywhere, ranked by GPUs
    h0 = build_row(
        CandidateResult("H100-80GB", 1, "h", config()[0], engine_args={}, command="c"),
        10.0,
        check_replicas(2, scripted(2, [])),  # type: ignore[arg-type]
        {},
    )
    assert h0.cost_per_hour is None and h0.cost_per_1m_output_tokens is None
    ranked, by = rank_rows([a, h0])
    assert by == "gpus" and ranked[0] is h0  # 2 GPUs before 3
    failed = build_row(
        CandidateResult("L4", 1, "l", config()[0], failure="no feasible config in the study"),
        None,
        None,
        prices,
    )
    ranked, _ = rank_rows([failed, a])
    assert ranked == [a, failed] and not failed.usable


def test_price_flags_and_files_name_what_is_wrong(tmp_path: Path) -> None:
    assert parse_price_flags(["h100-80gb=2.49,A100-80GB=1.5", "L4=0.8"]) == {
        "H100-80GB": 2.49,
        "A100-80GB": 1.5,
        "L4": 0.8,
    }
    for bad, why in (
        ("H100=2", "unknown hardware profile 'H100'"),
        ("H100-80GB=two", "not a number"),
        ("H100-80GB=-1", "positive number"),
        ("H100-80GB", "HARDWARE=PRICE"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_price_flags([bad])
    f = tmp_path / "prices.yaml"
    f.write_text("prices:\n  H100-80GB: 2.49\n  A100-80GB: 0\n")
    with pytest.raises(ConfigError, match=rf"^{f}:3: prices\.A100-80GB: .*greater than 0"):
        read_prices(f)
    f.write_text("prices:\n  h100-80gb: 2.49\n")
    assert read_prices(f) == {"H100-80GB": 2.49}


def test_a_real_worker_tries_no_tp_group_larger_than_the_host() -> None:
    from autotune.planning.size_run import measured_node

    assert measured_node(8, 4) == 4  # four GPUs here: TP up to 4
    assert measured_node(2, 8) == 2  # the node size the user gave still caps it
    assert measured_node(8, 0) == 1  # no GPU: vLLM's CPU backend, one device


def test_a_capacity_range_the_config_sets_is_kept() -> None:
    """size widens the capacity search to 0.05x..10x the workload's rate, but an end the
    config sets stays: a host that cannot drive ten times the rate is told to lower
    capacity_high, and that must work."""
    from autotune.planning.candidate_study import candidate_config

    base, _ = config()
    c = candidate_config(base, "A100-80GB", 1, 3)
    assert (c.strategy.capacity_low, c.strategy.capacity_high) == (0.05, 10.0)
    mine, _ = config(strategy={"capacity_high": 3.0})
    c = candidate_config(mine, "A100-80GB", 1, 3)
    assert (c.strategy.capacity_low, c.strategy.capacity_high) == (0.05, 3.0)


def test_a_real_workers_table_says_which_figures_are_measured() -> None:
    from autotune.planning.size_table import SizeReport

    def report(worker: str, kind: str) -> SizeReport:
        return SizeReport("x", Target(kind, 3.0), {}, worker, [], "gpus")  # type: ignore[arg-type]

    assert report("sim-virtual", "rate").provenance == "simulated"
    rate = report("vllm", "rate").provenance
    assert rate.startswith("measured on vllm: engine config, per-replica capacity, and the")
    assert "replica check with its latencies, tok/s and costs, on one replica" in rate
    streams = report("vllm", "concurrency").provenance
    assert "streams per replica bisected on the simulator" in streams
    assert "per-replica capacity" not in streams
