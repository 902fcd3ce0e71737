"""The twin strategy's rounds inside a run: before each claim, refit and re-screen when a
trial was measured since the stored round (docs/tuning.md#15-the-twin-strategy).

The round runs in a worker thread (minutes of CPU at most, ``strategy.twin.screen_cpu_s``),
so the run's heartbeats keep beating; its result is a study attribute, which the claim of
the next ``twin`` trial reads, so every controller of the study sees the same round.
"""

from __future__ import annotations

import asyncio

from autotune.sim import TwinFile, hardware_of, is_twin_name, load_twin
from autotune.tuning import study_attrs
from autotune.tuning.measure.twin_round import twin_round
from autotune.tuning.run.context import RunContext
from autotune.tuning.run.events import TwinRound

__all__ = ["DEFAULT_NOISE_PCT", "refresh_twin", "twin_start"]

# the noise band the stop rule uses before the server's noise is measured
DEFAULT_NOISE_PCT = 5.0


def twin_start(profile: str | None, hardware: str) -> tuple[str, TwinFile | None]:
    """The built-in profile the fit moves and the calibrated profile it starts from:
    ``strategy.twin.profile``, else the study's hardware (itself a file: or a built-in)."""
    name = profile or hardware
    if is_twin_name(name):
        spec = load_twin(name).spec
        return spec.base, spec
    return name, None


async def refresh_twin(ctx: RunContext) -> None:
    """Run a round when the stored one is older than the last measured trial."""
    cfg, study = ctx.cfg, ctx.study
    trials = [t for t in ctx.store.trials(cfg.name) if t.state in ("COMPLETE", "PRUNED")]
    stored = study_attrs.read_twin(study)
    if not trials or (stored is not None and stored.get("trials_seen") == len(trials)):
        return
    base_name, start = twin_start(cfg.strategy.twin.profile, cfg.hardware)
    noise = study_attrs.read_noise(study)
    band = noise.band_pct if noise is not None and noise.band_pct else DEFAULT_NOISE_PCT
    r = await asyncio.to_thread(
        twin_round,
        cfg,
        ctx.model,
        hardware_of(base_name),
        ctx.wl,
        ctx.bounds,
        trials,
        start=start,
        previous=stored,
        noise_pct=band,
        cpu_s=cfg.strategy.twin.screen_cpu_s,
        seed=cfg.seed + len(trials),
    )
    study_attrs.write_twin(study, r.to_dict())
    if ctx.on_event is not None:
        ctx.on_event(
            TwinRound(
                r.residual_pct,
                r.screened,
                r.cpu_s,
                r.next_args,
                r.predicted_gain_pct,
                r.stop,
                r.levels_fitted,
                r.levels,
            )
        )
