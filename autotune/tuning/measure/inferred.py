"""A trial that needs no worker (docs/tuning.md#14-settling-losing-trials, "A limit the
engine never reached").

A config that differs from a measured one only in ``max_num_seqs`` is the same engine at every
level where neither limit bound: the scheduler never had more requests to run than either
allows. So before a trial starts a worker, its search is run against the levels such a
measured twin stored (:func:`infer`): when every level the search asks for is one the twin
measured with the same load, noise draw and stop rule, and at that level the engine ran fewer
requests than either ``max_num_seqs``, preempted nothing and kept its KV cache below
:data:`KV_USAGE_LIMIT`, the trial's result is the twin's levels. Otherwise the trial runs as
always. The search logic is :func:`~autotune.tuning.measure.level_plan.measure` itself, fed by
a runner that answers from the stored levels, so the inferred trial takes exactly the path a
measured one would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.failures import FailureMatch
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.stop_rule import StopRule
from autotune.store import WorkerUsage
from autotune.tuning.measure.level_plan import (
    LevelPlan,
    Measured,
    MeasuredLevel,
    SettleBar,
    measure,
)
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo
from autotune.workload.core import Workload

__all__ = ["KV_USAGE_LIMIT", "Inferred", "KeptTrial", "infer"]

# Above this KV cache usage a twin's level does not stand for the trial's: max_num_seqs also
# sizes vLLM's start-up profiling run, so the two configs' KV pools differ slightly, and a
# pool nearly full could have preempted or held back requests in the smaller one. Scraped
# gauges only sample the usage, so the margin is wide
KV_USAGE_LIMIT = 0.9

_PARAM = "max_num_seqs"


@dataclass(frozen=True)
class KeptTrial:
    """A measured trial whose levels a later trial may stand on: its engine args, the
    settle bar it was measured under (None: a full search) and its levels in order."""

    number: int
    engine_args: Mapping[str, Any]
    settle: SettleBar | None
    levels: tuple[MeasuredLevel, ...]


@dataclass(frozen=True)
class Inferred:
    """A trial's measurement read off ``twin``'s levels: at every one of them the engine ran
    at most ``running`` requests at once, fewer than either config's ``max_num_seqs``."""

    twin: int
    measured: Measured
    running: int

    def line(self) -> str:
        """What progress and the trial's record say about it."""
        return (
            f"inferred from trial {self.twin}: max_num_seqs never bound there "
            f"(at most {self.running} requests ran at once, no preemption), so no worker "
            "was started"
        )


class _NotStored(Exception):
    """The search asked for a level the twin cannot stand for."""


def _key(scale: float) -> float:
    return float(f"{scale:.12g}")


def _looser(a: StopRule | None, b: StopRule | None) -> bool:
    """Whether rule ``a`` stops a level only where ``b`` does too (None: never stops): a
    level ``b`` let run to its end runs to its end under ``a`` as well."""
    if a is None:
        return True
    if b is None:
        return False

    def ge(x: float | None, y: float | None) -> bool:
        return x is None or (y is not None and x >= y)

    return (
        ge(a.p99_ttft_ms, b.p99_ttft_ms)
        and ge(a.p99_tpot_ms, b.p99_tpot_ms)
        and a.max_error_rate >= b.max_error_rate
        and a.max_overlength_rate >= b.max_overlength_rate
    )


@dataclass(frozen=True)
class _Stored:
    outcome: LevelOutcome
    draw: int
    rule: StopRule | None


def _stored_levels(twin: KeptTrial, plan: LevelPlan) -> dict[tuple[float, int], _Stored]:
    """The twin's levels by (load, run at that load), each with the noise draw and the stop
    rule it ran under, as :func:`measure` set them."""
    at = None
    widen = None
    if twin.settle is not None and plan.capacity:
        at = _key(plan.lattice.scale(twin.settle.index(plan.lattice)))
        widen = twin.settle.first_run_widening(plan.lattice)
    out: dict[tuple[float, int], _Stored] = {}
    runs: dict[float, int] = {}
    for lv in twin.levels:
        k = _key(lv.outcome.scale)
        n = runs.get(k, 0)
        runs[k] = n + 1
        settle_point = at is not None and k == at
        rule = plan.early_stop
        if settle_point and n == 0 and rule is not None and widen is not None:
            rule = rule.widened(widen)
        out[(k, n)] = _Stored(lv.outcome, n if settle_point else 0, rule)
    return out


class _StoredRunner:
    """A runner that answers :func:`measure` from a twin's stored levels, or raises
    :class:`_NotStored`."""

    kind = "stored"

    def __init__(
        self, levels: dict[tuple[float, int], _Stored], limit: int, plan: LevelPlan, draws: bool
    ) -> None:
        self.levels, self.limit, self.draws = levels, limit, draws
        self.rule: StopRule | None = plan.early_stop
        self.draw = 0
        self.runs: dict[float, int] = {}
        self.running = 0

    def set_early_stop(self, rule: StopRule | None) -> StopRule | None:
        prev, self.rule = self.rule, rule
        return prev

    def redraw(self, k: int) -> None:
        self.draw = k

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> StartInfo:
        raise NotImplementedError("a stored runner starts nothing")

    async def run_level(
        self,
        workload: Workload,
        scale: float,
        progress: Callable[[ProgressSnapshot], None] | None = None,
    ) -> LevelOutcome:
        k = _key(scale)
        n = self.runs.get(k, 0)
        self.runs[k] = n + 1
        got = self.levels.get((k, n))
        if got is None or (self.draws and got.draw != self.draw):
            raise _NotStored
        ran_out = got.outcome.stop is None
        if got.rule != self.rule and not (ran_out and _looser(self.rule, got.rule)):
            raise _NotStored
        out, peaks = got.outcome, got.outcome.peaks
        if (
            peaks is None
            or peaks.running >= self.limit
            or peaks.preemptions != 0
            or peaks.kv_usage is None
            or peaks.kv_usage > KV_USAGE_LIMIT
            or out.death is not None
            or out.metrics.client_limit is not None
            or out.metrics.partial
        ):
            raise _NotStored
        self.running = max(self.running, peaks.running)
        return out

    def failure(self) -> FailureMatch | None:
        return None

    async def stop(self) -> None:
        return None

    def usage(self) -> WorkerUsage | None:
        return None


def _differs_only_in_seqs(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.keys() != b.keys() or _PARAM not in a or a[_PARAM] == b[_PARAM]:
        return False
    return all(a[k] == b[k] for k in a if k != _PARAM)


async def infer(
    engine_args: Mapping[str, Any],
    kept: Sequence[KeptTrial],
    workload: Workload,
    plan: LevelPlan,
    *,
    settle: SettleBar | None,
    draws: bool,
) -> Inferred | None:
    """The trial of ``engine_args`` read off a kept twin's levels (the latest twin that
    answers every level its search asks for), or None to measure it. ``draws``: the study's
    runner draws fresh noise on request (a re-run of a level must match the twin's draw)."""
    for twin in reversed(kept):
        if not _differs_only_in_seqs(engine_args, twin.engine_args):
            continue
        limit = min(int(engine_args[_PARAM]), int(twin.engine_args[_PARAM]))
        if not twin.levels:
            continue
        runner = _StoredRunner(_stored_levels(twin, plan), limit, plan, draws)
        try:
            got = await measure(runner, workload, plan, settle=settle)
        except _NotStored:
            continue
        if got.levels:
            return Inferred(twin.number, got, runner.running)
    return None
