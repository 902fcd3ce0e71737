"""Fit the simulated engine's constants to what the probes measured (docs/calibrate.md#3-the-fit).

The twin predicts each probe by replaying the very same load in virtual time on the base
profile with candidate constants; the residual of a figure is ``ln(predicted / measured)``,
so every probe weighs by its relative error whatever its scale. :func:`fit_twin` moves the
constants in log space (they stay positive) with :func:`~autotune.calibrate.robust.robust_fit`
and returns a :class:`Calibration`: the fitted values, each with its standard error, and the
fit's relative error per metric. Pure: the simulator runs in this process, on virtual time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.calibrate.measured_levels import LevelTarget, predict_level
from autotune.calibrate.observe import (
    ENGINE_METRICS,
    Observation,
    engine_sums_of_sim,
    observe,
    timings_of_sim,
)
from autotune.calibrate.probes import Probe, probe_sim_requests
from autotune.calibrate.robust import RobustFit, Vector, robust_fit
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import EngineArgs, Measured, TwinFile, simulate, twin_constants, twin_hardware

__all__ = [
    "DEFAULT_FITTED",
    "FIT_STARTS",
    "PRIOR_SIGMA",
    "Calibration",
    "Constant",
    "Target",
    "fit_twin",
    "predict",
    "stream_bound",
]

# (section of the twin file, constant): the step cost's weight read, linear-layer FLOPs,
# decode KV reads and fixed overhead, and the API server's intake, tokenizing and streaming
# (docs/calibrate.md#3-the-fit says which probe pins each)
Constant = tuple[str, str]
# what the twin is fitted to: probes of a live server, or levels a study measured
Target = Probe | LevelTarget
DEFAULT_FITTED: tuple[Constant, ...] = (
    ("hardware", "eta_bw"),
    ("hardware", "eta_f"),
    ("hardware", "eta_attn"),
    ("cost", "t_fixed"),
    ("front_end", "per_request"),
    ("front_end", "per_prompt_token"),
    ("front_end", "per_output_token"),
)
# Runs of the fit, from the start and from seeded points around it: the figures are piecewise
# in the constants, so one run can stop in a local minimum (docs/calibrate.md#3-the-fit).
FIT_STARTS = 4
# The prior's width on ln(constant): a factor of 10 either way is one sigma. Wide enough for
# a server unlike the base profile's; a constant the probes do not pin stays near its base.
PRIOR_SIGMA = math.log(10.0)
# The API server's cost per streamed token, which stream_bound caps.
_STREAM: Constant = ("front_end", "per_output_token")
# A figure the twin cannot produce (every request rejected) costs this much in log units.
_MISSING = math.log(10.0)


@dataclass(frozen=True)
class Calibration:
    """The fitted constants by (section, name), each one's standard error (same units), the
    fit's median relative error per metric in percent, and the twin file they make."""

    base: str
    values: dict[Constant, float]
    stderr: dict[Constant, float]
    residual_pct: dict[str, float]
    fit: RobustFit

    def spec(self, measured: Mapping[str, str | None] | None = None) -> TwinFile:
        """The twin file: the fitted constants as overrides, their errors, the residuals."""
        return _twin_file(
            self.base,
            self.values,
            measured=Measured(**(measured or {})),
            uncertainty={name: v for (_, name), v in self.stderr.items()},
            residuals=dict(self.residual_pct),
        )


def _overrides(spec: TwinFile | None) -> dict[Constant, float]:
    """A twin file's own overrides by (section, name)."""
    if spec is None:
        return {}
    sections = {"hardware": spec.hardware, "cost": spec.cost, "front_end": spec.front_end}
    return {(sec, k): v for sec, d in sections.items() for k, v in d.items()}


def _twin_file(base: str, values: Mapping[Constant, float], **extra: Any) -> TwinFile:
    """The twin file on ``base`` that overrides ``values`` (``extra``: its other fields)."""
    sections: dict[str, dict[str, float]] = {"hardware": {}, "cost": {}, "front_end": {}}
    for (section, name), v in values.items():
        sections[section][name] = v
    return TwinFile(autotune_twin=1, base=base, **sections, **extra)


def stream_bound(targets: Sequence[Target], measured: Sequence[Observation]) -> float | None:
    """The most the API server can spend per streamed token and still have streamed what a
    closed loop of ``n`` measured: its client's mean gap over ``n`` (the twin's output loop
    delivers a step's ``n`` tokens one after another, so its gaps are at least ``n`` times
    that cost). None without a concurrency probe's gap (docs/calibrate.md#3-the-fit)."""
    loops = {p.name: p.concurrency for p in targets if isinstance(p, Probe) and p.concurrency > 1}
    caps = [o.value / loops[o.probe] for o in measured if o.metric == "itl" and o.probe in loops]
    return min(caps, default=None)


def predict(
    targets: Sequence[Target],
    model: ModelProfile,
    hardware: HardwareProfile,
    args: EngineArgs,
) -> list[Observation]:
    """Every target's figures as the simulated engine on ``hardware`` gives them (no
    jitter): a probe runs on ``args``, a measured level on its own."""
    out: list[Observation] = []
    for p in targets:
        if isinstance(p, LevelTarget):
            out += predict_level(p, model, hardware)
            continue
        res = simulate(
            model,
            hardware,
            args,
            probe_sim_requests(p),
            exact=True,
            jitter_cv=0.0,
            concurrency=p.concurrency if p.closed_loop else None,
        )
        out += observe(p, timings_of_sim(res.requests), engine_sums_of_sim(res.requests))
    return out


def fit_twin(
    targets: Sequence[Target],
    measured: Sequence[Observation],
    model: ModelProfile,
    base: HardwareProfile,
    args: EngineArgs,
    *,
    fitted: Sequence[Constant] = DEFAULT_FITTED,
    max_iter: int = 25,
    starts: int = FIT_STARTS,
    start: TwinFile | None = None,
    warm: Mapping[Constant, float] | None = None,
    time_limit_s: float | None = None,
) -> Calibration:
    """Fit ``fitted`` constants of ``base`` so the twin's figures for ``targets`` (probes or
    measured levels) match ``measured``.

    ``base`` must be a built-in profile (its name is the twin file's ``base``); ``start``, a
    calibrated profile on it, is where the fit starts and what its prior is centred on (its
    other overrides are kept). ``starts`` runs of the fit from seeded points around it, the
    best kept. Raises ValueError when nothing was measured or a fitted constant is 0 on the
    base (its log has no start). ``warm``: constants to begin at (an earlier fit's), the
    prior staying on ``start``. ``time_limit_s``: CPU seconds for the whole fit, its errors
    included: each run of it (a stage, a start) gets what is left divided among the runs
    still to come, so the stages together stay within it (up to one iteration each, which
    always runs). With the engine core's own figures among ``measured`` the fit runs in two
    stages, twice (below); ``Calibration.fit`` is then the API server's last stage. The
    API server's cost per streamed token ends at most at :func:`stream_bound`'s.
    """
    if not measured:
        raise ValueError("no probe measured anything: nothing to fit")
    begin = twin_constants(twin_hardware(start, base.name) if start is not None else base)
    names = list(fitted)
    zero = [f"{s}.{n}" for s, n in names if not begin[(s, n)] > 0]
    if zero:
        raise ValueError(f"cannot fit constant(s) that are 0 on {base.name}: {zero}")
    kept = _overrides(start)  # the start's other overrides stay in every candidate
    engine = [o for o in measured if o.metric in ENGINE_METRICS]
    steps = [c for c in names if c[0] != "front_end"]
    two_stage = bool(engine and steps and len(steps) < len(names))
    t0 = time.thread_time()
    runs = [4 if two_stage else 1]  # the stage runs still to come

    def share() -> float | None:
        """This run's CPU: what is left of the fit's limit over the runs still to come."""
        if time_limit_s is None:
            return None
        left = max(0.0, time_limit_s - (time.thread_time() - t0))
        runs[0] = max(1, runs[0])
        out = left / runs[0]
        runs[0] -= 1
        return out

    def stage(
        obs: Sequence[Observation], group: list[Constant], fixed: Mapping[Constant, float]
    ) -> tuple[dict[Constant, float], dict[Constant, float], RobustFit]:
        return _fit(
            targets,
            obs,
            model,
            base,
            args,
            group,
            begin,
            fixed,
            warm,
            max_iter,
            starts,
            share(),
        )

    # The engine core's own figures (observe.ENGINE_METRICS) time its steps and nothing
    # else: the step's constants are fitted to them alone, then the API server's to the
    # client's figures with those held, so what the model leaves out on the client's side
    # (its HTTP stack, a starved API server) cannot bend the step (docs/calibrate.md#3-the-fit).
    if two_stage:
        client = [o for o in measured if o.metric not in ENGINE_METRICS] or engine
        front: dict[Constant, float] = {}
        for _ in range(2):
            v1, e1, _ = stage(engine, steps, {**kept, **front})
            front, e2, fit = stage(client, [c for c in names if c not in steps], {**kept, **v1})
        values, stderr = {**v1, **front}, {**e1, **e2}
    else:
        values, stderr, fit = stage(measured, names, kept)
    cap = stream_bound(targets, measured)
    if cap is not None and values.get(_STREAM, 0.0) > cap:
        values[_STREAM] = cap
    final = {**kept, **values}
    hw = twin_hardware(_twin_file(base.name, final), f"{base.name}+fit")
    got = {o.key: o.value for o in predict(targets, model, hw, args)}
    by_metric: dict[str, list[float]] = {}
    for o in measured:
        if got.get(o.key, 0) > 0 and o.value > 0:
            by_metric.setdefault(o.metric, []).append(abs(got[o.key] / o.value - 1) * 100.0)
    residual_pct = {m: round(float(np.median(v)), 2) for m, v in sorted(by_metric.items())}
    return Calibration(base.name, final, stderr, residual_pct, fit)


def _fit(
    targets: Sequence[Target],
    measured: Sequence[Observation],
    model: ModelProfile,
    base: HardwareProfile,
    args: EngineArgs,
    names: list[Constant],
    begin: Mapping[Constant, float],
    kept: Mapping[Constant, float],
    warm: Mapping[Constant, float] | None,
    max_iter: int,
    starts: int,
    time_limit_s: float | None,
) -> tuple[dict[Constant, float], dict[Constant, float], RobustFit]:
    """One robust fit of ``names`` to ``measured``, the other constants at ``kept``; the
    prior is centred on ``begin``, the runs start there (or at ``warm``). Returns the
    fitted values, their standard errors and the fit."""
    x0 = np.array([math.log(begin[c]) for c in names])
    want = {o.key: o.value for o in measured}
    mu = x0.copy()
    if warm:
        x0 = np.array(
            [math.log(warm[c]) if warm.get(c, 0) > 0 else v for c, v in zip(names, x0, strict=True)]
        )

    def residual(x: Vector) -> Vector:
        values = {**kept, **dict(zip(names, np.exp(x), strict=True))}
        hw = twin_hardware(_twin_file(base.name, values), f"{base.name}+fit")
        got = {o.key: o.value for o in predict(targets, model, hw, args)}
        return np.array(
            [
                math.log(got[k] / v) if got.get(k, 0) > 0 and v > 0 else _MISSING
                for k, v in want.items()
            ]
        )

    t0 = time.thread_time()
    # The probes' figures are piecewise in the constants (a request that arrives just after a
    # step starts waits a whole step), so a damped Gauss-Newton run can stop in a local
    # dip: start it from the base and from a few seeded points around it, keep the best.
    # The errors (four evaluations per constant, robust_fit) only for the best start.
    rng = np.random.default_rng(0)
    sigma = np.full(x0.size, PRIOR_SIGMA)
    fits = [
        robust_fit(
            residual,
            x0 + (rng.uniform(-1.0, 1.0, x0.size) if k else 0.0),
            prior_mean=mu,
            prior_sigma=sigma,
            max_iter=max_iter,
            # the starts share the run's CPU
            time_limit_s=time_limit_s / starts if time_limit_s is not None else None,
            errors=False,
            reserve_evals=4 * x0.size,  # the best start's errors, below
        )
        for k in range(starts)
    ]
    best = min(fits, key=lambda f: f.cost).x
    # the errors get what is left of the run's CPU (its wide step only while it lasts)
    left = max(0.0, time_limit_s - (time.thread_time() - t0)) if time_limit_s is not None else None
    fit = robust_fit(
        residual, best, prior_mean=mu, prior_sigma=sigma, max_iter=0, time_limit_s=left
    )
    values = dict(zip(names, (float(v) for v in np.exp(fit.x)), strict=True))
    # d(e^x) = e^x dx: a log-space error is a relative one
    stderr = {c: values[c] * float(s) for c, s in zip(names, fit.stderr, strict=True)}
    return values, stderr, fit
