"""One round of the twin strategy: fit the twin to every level measured so far, screen the
space on it in virtual time, and name the next config worth a real trial
(docs/tuning.md#15-the-twin-strategy).

- **Fit.** Each measured trial's levels are calibration targets
  (:class:`autotune.calibrate.LevelTarget`): the same sample, looped and scaled as the level
  ran it, replayed on the twin with that trial's engine args. A level costs no extra GPU time;
  the fit starts from the previous round's constants.
- **Screen.** A multivariate TPE study in memory over the study's whole space, each config's
  capacity measured on the twin with the study's own protocol (jitter off), until the CPU
  budget or the trial cap is spent.
- **Next.** The best screened config not yet measured, and its predicted gain over the best
  measured config, both on the twin (its bias cancels in the ratio). The round says stop when
  that gain lies inside the noise band, or nothing unmeasured is left.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.calibrate import (
    DEFAULT_FITTED,
    LevelTarget,
    Observation,
    fit_twin,
    level_observations,
)
from autotune.calibrate.measured_levels import predict_level
from autotune.calibrate.twin_fit import Calibration
from autotune.config import StudyConfig
from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile
from autotune.sim import TwinFile, sim_engine_args, twin_hardware
from autotune.store import TrialRecord
from autotune.tuning.measure.level_plan import LevelPlan
from autotune.tuning.measure.protocol import Protocol, measure_config
from autotune.tuning.search.space import SpaceBounds, suggest
from autotune.workload.build import scale_rate
from autotune.workload.core import Workload
from autotune.workload.sustain import sustain

__all__ = [
    "TwinRound",
    "affordable",
    "args_key",
    "fit_from_trials",
    "level_targets",
    "screen",
    "twin_round",
]

# levels per measured trial the fit replays: the highest feasible ones and the lowest
# infeasible one, where the SLO verdict turns (the constants that move capacity show there)
_LEVELS_PER_TRIAL = 3
_MAX_TARGETS = 12
# the fit's share of a round's CPU budget; the screen has the rest
_FIT_SHARE = 0.4
# replays of every level a fit takes at least: one at its start, a Jacobian (one per
# constant), one step, and the errors' narrow step (two per constant); calibrate/robust.py
_FLOOR_EVALS = 3 * len(DEFAULT_FITTED) + 2


def _level_name(trial_number: int, scale: float) -> str:
    """A measured level's target name: its trial, then its load scale (``_trial_of``)."""
    return f"trial{trial_number}@{scale:.4g}"


def _trial_of(name: str) -> str:
    """The trial part of a ``_level_name``."""
    return name.partition("@")[0]


def _constants(stored: Mapping[str, Any] | None) -> dict[tuple[str, str], float] | None:
    """A stored round's fitted constants by (section, name)."""
    if not stored or not stored.get("constants"):
        return None
    out = {}
    for key, v in stored["constants"].items():
        section, _, name = str(key).partition(".")
        out[(section, name)] = float(v)
    return out


def args_key(engine_args: Mapping[str, Any]) -> str:
    """One config's identity across rounds (its engine args, sorted)."""
    return json.dumps(dict(engine_args), sort_keys=True, default=str)


@dataclass(frozen=True)
class TwinRound:
    """What one round found: the fitted constants (``section.name``), their errors and the
    fit's residuals; the screened configs best first with their predicted objective; the
    twin's prediction for every measured config; the next config (None: stop, and why); the
    levels the fit replayed of those it could (``affordable``)."""

    constants: dict[str, float]
    stderr: dict[str, float]
    residual_pct: dict[str, float]
    ranked: list[tuple[dict[str, Any], float]]
    measured_pred: dict[str, float]
    next_args: dict[str, Any] | None
    predicted_gain_pct: float | None
    stop: str | None
    screened: int
    cpu_s: float
    spec: TwinFile | None = field(default=None, compare=False)
    next_predicted: float | None = None
    trials_seen: int = 0
    levels_fitted: int = 0
    levels: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The stored form (a study attribute; the ranked list cut to its top 5)."""
        return {
            "constants": self.constants,
            "stderr": self.stderr,
            "residual_pct": self.residual_pct,
            "ranked": [{"engine_args": ea, "predicted": v} for ea, v in self.ranked[:5]],
            "measured_pred": self.measured_pred,
            "next_args": self.next_args,
            "next_predicted": self.next_predicted,
            "predicted_gain_pct": self.predicted_gain_pct,
            "stop": self.stop,
            "screened": self.screened,
            "cpu_s": round(self.cpu_s, 2),
            "profile": self.spec.model_dump() if self.spec is not None else None,
            "trials_seen": self.trials_seen,
            "levels_fitted": self.levels_fitted,
            "levels": self.levels,
        }


def level_targets(
    cfg: StudyConfig, wl: Workload, trials: Sequence[TrialRecord]
) -> tuple[list[LevelTarget], list[Observation]]:
    """The measured levels worth fitting to (the last ``_MAX_TARGETS``), and their figures
    (module docstring)."""
    plan = LevelPlan.of(cfg)
    targets: list[LevelTarget] = []
    observed: list[Observation] = []
    for t in trials:
        if t.state != "COMPLETE" or not t.levels:
            continue
        ok = sorted((lv for lv in t.levels if lv.feasible), key=lambda lv: -lv.scale)
        bad = sorted((lv for lv in t.levels if not lv.feasible), key=lambda lv: lv.scale)
        for lv in ok[: _LEVELS_PER_TRIAL - 1] + bad[:1]:
            name = _level_name(t.optuna_trial_number, lv.scale)
            obs = level_observations(name, lv.metrics)
            if not obs:
                continue
            looped = sustain(wl, lv.scale, plan.min_level_s, plan.min_level_requests)
            args = sim_engine_args(t.engine_args, cfg.worker.static_args)
            targets.append(
                LevelTarget(name, args, scale_rate(looped, lv.scale), cfg.workload.warmup)
            )
            observed += obs
    kept = targets[-_MAX_TARGETS:]
    names = {t.name for t in kept}
    return kept, [o for o in observed if o.probe in names]


def affordable(
    targets: Sequence[LevelTarget],
    observed: Sequence[Observation],
    model: ModelProfile,
    hardware: HardwareProfile,
    cpu_s: float,
) -> tuple[list[LevelTarget], list[Observation]]:
    """The latest trials' ``targets`` whose fit costs at most ``cpu_s`` of CPU, the latest
    trial's always: each trial's levels replayed once on ``hardware`` (the fit's start),
    latest first, until ``_FLOOR_EVALS`` times the replays of those kept would pass it. The
    fit's first iteration and its errors always run, so the levels it replays are what keeps
    a round within its CPU; a trial's levels go together, since together they place its
    capacity (docs/tuning.md#15-the-twin-strategy)."""
    trials: dict[str, list[LevelTarget]] = {}
    for t in targets:
        trials.setdefault(_trial_of(t.name), []).append(t)
    kept: list[LevelTarget] = []
    cost = 0.0
    for group in reversed(list(trials.values())):
        t0 = time.thread_time()
        for t in group:
            predict_level(t, model, hardware)
        cost += time.thread_time() - t0
        if kept and cost * _FLOOR_EVALS > cpu_s:
            break
        kept = group + kept
    names = {t.name for t in kept}
    return kept, [o for o in observed if o.probe in names]


def fit_from_trials(
    cfg: StudyConfig,
    model: ModelProfile,
    base: HardwareProfile,
    wl: Workload,
    trials: Sequence[TrialRecord],
    *,
    start: TwinFile | None = None,
    starts: int | None = None,
) -> Calibration:
    """The twin fitted to a study's measured levels (``autotune calibrate --from-study``,
    docs/calibrate.md#4-from-measured-levels), from ``starts`` runs (None: two). Raises
    ValueError when no trial measured a level with figures."""
    targets, observed = level_targets(cfg, wl, trials)
    if not targets:
        raise ValueError(f"study {cfg.name!r} has no measured level to fit to")
    return fit_twin(
        targets, observed, model, base, sim_engine_args({}, {}), starts=starts or 2, start=start
    )


def screen(
    cfg: StudyConfig,
    hardware: HardwareProfile,
    wl: Workload,
    bounds: SpaceBounds,
    *,
    seeds: Sequence[Mapping[str, Any]] = (),
    again: Sequence[Mapping[str, Any]] = (),
    cpu_s: float = 60.0,
    max_configs: int = 200,
    seed: int = 0,
) -> list[tuple[dict[str, Any], float]]:
    """Configs of the space with their objective on ``hardware`` (the twin), best first:
    ``seeds`` (the measured configs, each needs a prediction) first, then ``again`` (the
    previous round's best) and TPE while ``cpu_s`` of CPU (at the configs' mean cost so far)
    and ``max_configs`` configs last."""
    proto = Protocol(cfg.strategy.capacity_resolution, 0.0)
    seen: dict[str, tuple[dict[str, Any], float]] = {}
    t0 = time.thread_time()

    def value(ea: dict[str, Any]) -> float:
        key = args_key(ea)
        if key not in seen:
            m = asyncio.run(measure_config(cfg, ea, proto, workload=wl, hardware=hardware))
            seen[key] = (ea, m.objective)
        return seen[key][1]

    def spent() -> bool:
        """No config is started that would pass ``cpu_s`` at the mean cost so far."""
        used = time.thread_time() - t0
        return len(seen) >= max_configs or used + used / max(1, len(seen)) > cpu_s

    for ea in seeds:
        value(dict(ea))
    for ea in again:  # only within the budget (docs/tuning.md#15-the-twin-strategy)
        if spent():
            break
        value(dict(ea))
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
    # no "new study created" or "trial finished" lines for the twin's own study; the
    # caller's verbosity comes back after (as in report/study_view.py)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        while not spent():
            trial = study.ask()
            ea = suggest(trial, bounds).engine_args()
            study.tell(trial, value(ea))
    finally:
        optuna.logging.set_verbosity(verbosity)
    return sorted(seen.values(), key=lambda kv: -kv[1])


def twin_round(
    cfg: StudyConfig,
    model: ModelProfile,
    base: HardwareProfile,
    wl: Workload,
    bounds: SpaceBounds,
    trials: Sequence[TrialRecord],
    *,
    start: TwinFile | None = None,
    previous: Mapping[str, Any] | None = None,
    noise_pct: float = 5.0,
    cpu_s: float = 60.0,
    seed: int = 0,
) -> TwinRound:
    """Fit, screen and choose (module docstring). ``base`` is the built-in profile the fit
    moves; ``start`` a calibrated profile the fit's prior is centred on; ``previous`` the
    stored form of the previous round, whose constants the fit begins at and whose best
    configs the screen measures again first. The fit may take up to 40 % of ``cpu_s``."""
    t0 = time.thread_time()
    hw = twin_hardware(start, f"{base.name}+twin") if start is not None else base
    targets, observed = level_targets(cfg, wl, trials)
    levels = len(targets)
    cal: Calibration | None = None
    spec = start
    if targets:
        stored = (previous or {}).get("profile")
        warm = TwinFile.model_validate(stored) if stored else None
        at = twin_hardware(warm, f"{base.name}+twin") if warm is not None else hw
        targets, observed = affordable(targets, observed, model, at, _FIT_SHARE * cpu_s)
        cal = fit_twin(
            targets,
            observed,
            model,
            base,
            sim_engine_args({}, {}),
            max_iter=8,
            starts=1,
            start=start,
            warm=_constants(previous),
            time_limit_s=max(0.0, _FIT_SHARE * cpu_s - (time.thread_time() - t0)),
        )
        spec = cal.spec()
        hw = twin_hardware(spec, f"{base.name}+twin")
    measured = [t for t in trials if t.state in ("COMPLETE", "PRUNED")]
    seeds = [t.engine_args for t in measured]
    again = [r["engine_args"] for r in (previous or {}).get("ranked", [])]
    left = max(1.0, cpu_s - (time.thread_time() - t0))
    ranked = screen(cfg, hw, wl, bounds, seeds=seeds, again=again, cpu_s=left, seed=seed)
    pred = {args_key(ea): v for ea, v in ranked}
    measured_pred = {
        args_key(t.engine_args): pred.get(args_key(t.engine_args), 0.0) for t in measured
    }
    done = set(measured_pred)
    best_measured = max(
        (t for t in measured if t.objective is not None),
        key=lambda t: t.objective or 0.0,
        default=None,
    )
    ref = pred.get(args_key(best_measured.engine_args), 0.0) if best_measured else 0.0
    nxt = next(((ea, v) for ea, v in ranked if args_key(ea) not in done), None)
    gain = (nxt[1] / ref - 1.0) * 100.0 if nxt is not None and ref > 0 else None
    stop = None
    if nxt is None:
        stop = "the twin has no unmeasured config left"
    elif gain is not None and gain <= noise_pct:
        stop = (
            f"the twin's best unmeasured config gains {gain:+.1f} % on the best measured "
            f"one, inside the noise band ({noise_pct:.1f} %)"
        )
    consts = {f"{s}.{n}": v for (s, n), v in (cal.values.items() if cal else [])}
    errs = {f"{s}.{n}": v for (s, n), v in (cal.stderr.items() if cal else [])}
    return TwinRound(
        consts,
        errs,
        dict(cal.residual_pct) if cal else {},
        ranked[:20],
        measured_pred,
        None if stop else (nxt[0] if nxt else None),
        gain,
        stop,
        len(ranked),
        time.thread_time() - t0,
        spec,
        None if stop or nxt is None else nxt[1],
        len(measured),
        len(targets) if cal else 0,
        levels,
    )
