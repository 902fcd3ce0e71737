"""The server's run-to-run noise, measured once per study (docs/tuning.md#7-validation,
"The server's noise"): the baseline trial's boundary level (the capacity its search found; in
one-level modes its only level) replayed 3 times in all on the same started worker, right
after its search. Its figures give the noise band: a validated gain inside it cannot be told
from re-running the same config, and the verdict then says so
(:mod:`autotune.tuning.measure.verdict`).

:func:`measure_noise` runs the 2 extra levels; :func:`band_of` and :class:`NoiseRecord` are
pure. The record is stored as a study attribute (:mod:`autotune.tuning.study_attrs`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autotune.tuning.measure.level_plan import LevelPlan, Measured
from autotune.tuning.measure.runner_protocol import Redrawable, Runner
from autotune.tuning.measure.scoring import score_level, worst_slo_margin
from autotune.workload.core import Workload
from autotune.workload.sustain import sustain

__all__ = [
    "NOISE_RUNS",
    "NoiseRecord",
    "NoiseRun",
    "Redrawable",
    "band_of",
    "boundary_scale",
    "measure_noise",
    "spread_pct",
]

log = logging.getLogger(__name__)

# runs of the boundary level in all: the search's own run and 2 more (cost: 2 levels)
NOISE_RUNS = 3


@dataclass(frozen=True)
class NoiseRun:
    """One run of the boundary level."""

    held: bool  # its SLOs held (the level was feasible)
    output_tok_s: float
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    # 1 / the worst p99 / SLO over the latency SLOs set: the binding latency's headroom
    # (None: no latency SLO is set, offline mode, or one was not measured)
    headroom: float | None
    # it replayed to its end: an early-stopped run's figures cover only the part it replayed
    # (docs/tuning.md#10-early-stop-inside-a-level) and are left out of the spreads
    whole: bool = True

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NoiseRun:
        return cls(
            bool(d["held"]),
            float(d["output_tok_s"]),
            _opt(d.get("p99_ttft_ms")),
            _opt(d.get("p99_tpot_ms")),
            _opt(d.get("headroom")),
            bool(d.get("whole", True)),
        )


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def spread_pct(xs: Sequence[float]) -> float | None:
    """``100 * (max - min) / mean`` (None: fewer than two values, or a mean not above 0)."""
    if len(xs) < 2:
        return None
    mean = math.fsum(xs) / len(xs)
    return 100.0 * (max(xs) - min(xs)) / mean if mean > 0 else None


@dataclass(frozen=True)
class NoiseRecord:
    """The noise of the server as its baseline's boundary level measured it."""

    trial: int  # the baseline trial
    scale: float  # the level's load scale
    runs: tuple[NoiseRun, ...]
    step_pct: float  # one capacity-lattice step, percent
    throughput_spread_pct: float | None
    headroom_spread_pct: float | None
    band_pct: float

    @property
    def held(self) -> int:
        return sum(r.held for r in self.runs)

    @property
    def disagree(self) -> bool:
        """The runs disagreed on whether the level held its SLOs."""
        return 0 < self.held < len(self.runs)

    def text(self) -> str:
        """E.g. "the server's noise band is 2.1 % (trial 0's level 1.23x measured 3 times:
        held in 3 of 3; output tok/s 1,010 … 1,031; headroom to the binding latency SLO
        1.02 … 1.04)"."""
        whole = [r for r in self.runs if r.whole]
        tps = [r.output_tok_s for r in whole]
        parts = [f"held in {self.held} of {len(self.runs)}"]
        if len(whole) < len(self.runs):
            parts.append(f"{len(self.runs) - len(whole)} stopped early, figures left out")
        if tps:
            parts.append(f"output tok/s {min(tps):,.0f} … {max(tps):,.0f}")
        heads = [r.headroom for r in whole if r.headroom is not None]
        if heads:
            parts.append(f"headroom to the binding latency SLO {min(heads):.3f} … {max(heads):.3f}")
        if self.disagree:
            parts.append(f"feasibility differed: at least one lattice step, {self.step_pct:g} %")
        return (
            f"the server's noise band is {self.band_pct:.1f} % (trial {self.trial}'s level "
            f"{self.scale:.4g}x measured {len(self.runs)} times: " + "; ".join(parts) + ")"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [asdict(r) for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NoiseRecord:
        return cls(
            int(d["trial"]),
            float(d["scale"]),
            tuple(NoiseRun.from_dict(r) for r in d["runs"]),
            float(d["step_pct"]),
            _opt(d.get("throughput_spread_pct")),
            _opt(d.get("headroom_spread_pct")),
            float(d["band_pct"]),
        )


def band_of(trial: int, scale: float, runs: Sequence[NoiseRun], step_pct: float) -> NoiseRecord:
    """The noise band of ``runs`` (percent): the larger of the spread of their output tok/s
    and the spread of their binding latency's headroom (:func:`spread_pct`) over the runs
    that replayed to their end, and at least one lattice step (``step_pct``) when they
    disagree on feasibility (docs/tuning.md#7-validation)."""
    whole = [r for r in runs if r.whole]
    tps = spread_pct([r.output_tok_s for r in whole])
    heads = [r.headroom for r in whole if r.headroom is not None]
    hs = spread_pct(heads) if len(heads) == len(whole) else None
    held = sum(r.held for r in runs)
    floor = step_pct if 0 < held < len(runs) else 0.0
    band = max(tps or 0.0, hs or 0.0, floor)
    return NoiseRecord(trial, scale, tuple(runs), step_pct, tps, hs, band)


def boundary_scale(measured: Measured) -> float | None:
    """The level whose noise is measured: the capacity the search found (at the top or
    bottom of the range, the lattice point it ended on), or a one-level mode's level."""
    if not measured.levels:
        return None
    cap = measured.capacity
    if cap is None:
        return measured.levels[-1].score.scale
    if cap.scale is not None:
        return cap.scale
    return min(lv.score.scale for lv in measured.levels)  # nothing held: the bottom


async def measure_noise(
    runner: Runner,
    workload: Workload,
    plan: LevelPlan,
    measured: Measured,
    *,
    trial: int,
) -> NoiseRecord | None:
    """Replay the baseline's boundary level ``NOISE_RUNS - 1`` more times on the started
    ``runner`` and return the noise record (None: no level to repeat, or the worker died;
    the verdict then goes without a band)."""
    scale = boundary_scale(measured)
    if scale is None or measured.death is not None:
        return None
    first = [lv for lv in measured.levels if math.isclose(lv.score.scale, scale, rel_tol=1e-9)]
    if not first:
        return None
    outs = [first[-1].outcome]
    # the same level the search replayed: its sample looped to the plan's minimum length
    # (docs/tuning.md#13-level-length)
    wl = sustain(workload, scale, plan.min_level_s, plan.min_level_requests)
    redraw = runner.redraw if isinstance(runner, Redrawable) else None
    tries = 2 * (NOISE_RUNS - 1)  # a client-limited run is run once more
    while len(outs) < NOISE_RUNS and tries > 0:
        tries -= 1
        if redraw is not None:
            redraw(len(outs))
        out = await runner.run_level(wl, scale)
        if runner.failure() is not None:
            log.warning("the worker died while measuring the server's noise: no noise band")
            return None
        if out.metrics.client_limit is None:  # else its figures are the client's
            outs.append(out)
    if len(outs) < NOISE_RUNS:
        log.warning("the client could not drive the noise runs' load: no noise band")
        return None
    runs = []
    for out in outs:
        m = out.metrics
        ls = score_level(
            m,
            plan.slo,
            scale,
            latency_slos=plan.latency_slos,
            preemption_constraint=plan.preemption_constraint,
        )
        margin = worst_slo_margin(m, plan.slo) if plan.latency_slos else None
        runs.append(
            NoiseRun(
                ls.feasible,
                m.output_throughput,
                m.p99_ttft_ms,
                m.p99_tpot_ms,
                1.0 / margin if margin is not None and margin > 0 else None,
                out.stop is None,
            )
        )
    return band_of(trial, scale, runs, 100.0 * plan.lattice.resolution)
