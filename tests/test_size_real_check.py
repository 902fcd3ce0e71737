"""The replicated check on one replica of the study's own worker
(docs/sizing.md#9-on-real-workers): one start, one level per replica count at that count's
share of the target, the deployment's tok/s as that many times the replica's, and the
worker's cost counted with the row. Driven through the same runner path on a ``sim-virtual``
candidate; the launch of real vLLM is the measured run in docs/sizing.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.studies import config

import autotune.planning.real_check as real_check
from autotune.planning.candidate_study import CandidateResult, run_candidate
from autotune.planning.replicas import Target
from autotune.planning.size_run import size_row
from autotune.store import Store
from autotune.tuning.search.plan import model_of


class Spy:
    """A runner that records what the check asked of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.starts: list[dict[str, Any]] = []
        self.rates: list[float] = []
        self.throughputs: list[float] = []
        self.stopped = False

    async def start(self, engine_args: dict[str, Any], name: str) -> Any:
        self.starts.append(dict(engine_args))
        return await self.inner.start(engine_args, name)

    async def run_level(self, wl: Any, scale: float) -> Any:
        self.rates.append(round(len(wl.requests) / wl.arrivals()[-1] * scale, 1))
        out = await self.inner.run_level(wl, scale)
        self.throughputs.append(out.metrics.output_throughput)
        return out

    async def stop(self) -> None:
        self.stopped = True
        await self.inner.stop()

    def usage(self) -> Any:
        return self.inner.usage()


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, CandidateResult]:
    """A short study's best config and capacity on sim-virtual."""
    cfg, _ = config()
    db = tmp_path_factory.mktemp("real-check") / "s.db"
    with Store.open(f"sqlite:///{db}") as store:
        c = run_candidate(cfg, cfg.hardware, 1, 3, store)
    assert c.capacity_rps is not None and c.engine_args is not None
    return cfg, c


def test_the_check_runs_one_replica_at_each_counts_share(
    candidate: tuple[Any, CandidateResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, c = candidate
    assert c.capacity_rps is not None
    spies: list[Spy] = []
    make = real_check.make_runner

    def spied(*args: Any, **kw: Any) -> Spy:
        spies.append(Spy(make(*args, **kw)))
        return spies[-1]

    monkeypatch.setattr(real_check, "make_runner", spied)
    model = model_of(cfg)
    target = Target("rate", round(2.5 * c.capacity_rps, 1))  # three replicas, then two
    sim = size_row(cfg, model, c, target, {})
    row = size_row(cfg, model, c, target, {}, tmp_path / "w")
    assert sim.check_on == "simulator" and row.check_on == "sim-virtual"
    (spy,) = spies
    assert spy.starts == [c.engine_args] and spy.stopped  # one launch, stopped after
    assert row.replicas is not None and row.replicas >= 3 and row.check is not None
    # a level per count the check ran (n, then n - 1; a raised count adds one), each at the
    # count's share of the target
    counts = list(range(row.replicas - 1, row.replicas + 1))
    assert sorted(spy.rates)[-2:] == pytest.approx([target.value / n for n in counts[::-1]], 0.1)
    at_n = spy.throughputs[spy.rates.index(min(spy.rates))]
    assert row.output_tps == pytest.approx(row.replicas * at_n)
    # the check's worker costs GPU-seconds, counted with the candidate's study
    assert row.study_gpu_s > c.study_gpu_s


def test_a_check_that_cannot_start_is_the_rows_reason(
    candidate: tuple[Any, CandidateResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.errors import WorkerStartupError
    from autotune.failures import FailureClass

    cfg, c = candidate

    class NoStart(Spy):
        async def start(self, engine_args: dict[str, Any], name: str) -> Any:
            raise WorkerStartupError(
                "vLLM exited during startup: CUDA out of memory", FailureClass.FREE_MEMORY
            )

    make = real_check.make_runner
    monkeypatch.setattr(real_check, "make_runner", lambda *a, **k: NoStart(make(*a, **k)))
    row = size_row(cfg, model_of(cfg), c, Target("rate", 1.0), {}, tmp_path / "w")
    assert not row.usable and row.check_on == "sim-virtual"
    assert row.failure == (
        "the replica check on sim-virtual: vLLM exited during startup: CUDA out of memory"
    )
