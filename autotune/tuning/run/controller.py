"""This process as a controller of a study (docs/faults.md#2-controllers-workers-and-claims):
``run_study`` loads the study, checks its workload, builds the run's :class:`RunContext`
once and runs trials on its lanes (``tuning/run/lane_loop.py``) until the plan, ``n_trials`` or
the time limit ends the run. Optuna's RDB storage and autotune's tables share one database
(SQLite by default, Postgres in production), so many controllers can share a study and a
run can be resumed after Ctrl-C. Creating a study is ``tuning/run/create.py``."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.config import StudyConfig
from autotune.errors import ConfigError, NotFoundError
from autotune.sim import hardware_of
from autotune.store import Store
from autotune.tuning import attrs, study_attrs
from autotune.tuning.run.context import RunContext, RunHooks, RunReport
from autotune.tuning.run.create import load_study_config
from autotune.tuning.run.events import OnEvent
from autotune.tuning.run.lane_loop import run_trials
from autotune.tuning.run.lanes import plan_lanes
from autotune.tuning.run.session import ControllerSession
from autotune.tuning.run.stopping import Interrupted, stop_on_signals
from autotune.tuning.search.plan import model_of
from autotune.workload.build import study_workload

__all__ = ["fail_running", "run_study", "sampler_seed", "study_workdir"]

log = logging.getLogger(__name__)


def study_workdir(cfg: StudyConfig, name: str) -> Path:
    """Where study ``name``'s workers run by default: ``worker.workdir/<name>``."""
    return Path(cfg.worker.workdir) / name


def sampler_seed(seed: int, n_trials: int) -> int:
    """A fresh sampler's seed for the next trial: a hash of the study's seed and the trial
    count. (``seed + n`` would make seed 1's samples seed 0's shifted by one trial.)"""
    ss = np.random.SeedSequence([seed & 0xFFFFFFFF, n_trials])
    return int(ss.generate_state(1)[0])


def fail_running(study: optuna.Study, store: Store, name: str) -> None:
    """Mark every RUNNING trial FAIL and every RUNNING validation run PENDING. Only for what a
    killed controller left behind (Ctrl-C already does it for its own): other controllers
    sharing the study may be running theirs, so this is never done implicitly."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
    for tr in store.trials(name):
        if tr.state == "RUNNING" and tr.id is not None:
            store.update_trial(tr.id, state="FAIL")
    for rr in store.repeats(name):  # validation runs are units of work: run them again
        if rr.state == "RUNNING" and rr.id is not None:
            store.update_repeat(rr.id, state="PENDING", started_at=None)


async def _run(ctx: RunContext) -> RunReport:
    """This process as one of the study's controllers (registered, heartbeating, recovering
    what others left, docs/faults.md) running trials until the plan, ``n_trials`` or
    ``timeout`` ends the run, on each lane of ``ctx.plan`` at once (docs/parallel.md);
    SIGTERM and SIGHUP end it as Ctrl-C does."""
    ended, note = "failed", None
    try:
        recovered = ctx.session.open()
        with stop_on_signals() as stop:
            try:
                report = await run_trials(ctx, recovered, stop.signum_now)
            except asyncio.CancelledError:
                if stop.signum is not None:
                    ended, note = "interrupted", signal.Signals(stop.signum).name
                    raise Interrupted(stop.signum) from None
                raise
        ended = "stopped"
        return report
    except KeyboardInterrupt:
        ended, note = "interrupted", note or "interrupted"
        raise
    except BaseException as exc:
        note = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        ctx.session.close(ended, note)


def run_study(
    name: str,
    store: Store,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    on_event: OnEvent | None = None,
    workdir: Path | None = None,
    reset_running: bool = False,
    gpus: str | None = None,
    gpus_per_trial: int | None = None,
    hooks: RunHooks | None = None,
) -> RunReport:
    """Run (or resume) the study ``name``. ``gpus`` (``--gpus``): run trials in parallel,
    ``gpus_per_trial`` devices each (docs/parallel.md); it overrides ``worker.gpus``.
    ``hooks``: optuna-dashboard's notes and plots (``autotune.report.dashboard.HOOKS``)."""
    rec = store.get_study(name)
    if rec is None:
        raise NotFoundError(
            f"no study named {name!r} in {store.url.split('@')[-1]}; "
            "create it with `autotune study create --config FILE`"
        )
    cfg = load_study_config(rec)
    if cfg.record.git is not None and (hooks is None or hooks.record is None):
        # the git record lives in a layer above this one: every entry point passes its hooks
        log.warning(
            "record.git is set, but this run was started without the git record's hooks "
            "(autotune.gitrecord.run_hooks.HOOKS): it commits nothing (docs/git-record.md)"
        )
    if gpus is None and gpus_per_trial is not None:
        raise ConfigError("--gpus-per-trial applies only with --gpus")
    plan = plan_lanes(gpus, gpus_per_trial, cfg) if gpus is not None else None
    if plan is not None and len(plan.lanes) > 1 and cfg.worker.kind == "sim-virtual":
        log.warning(
            "worker.kind sim-virtual simulates in this process: its %d lanes take turns "
            "(docs/parallel.md#6-the-in-process-simulator)",
            len(plan.lanes),
        )
    model, hw = model_of(cfg), hardware_of(cfg.hardware)
    study = optuna.load_study(study_name=rec.optuna_study_name, storage=store.optuna_storage())
    header = study_attrs.read_header(study)
    bounds, stored = header.bounds, header.workload_fingerprint
    wl = study_workload(cfg, vocab_size=model.vocab_size, expect_fingerprint=stored)
    if wl.fingerprint() != stored:
        raise ConfigError(
            f"study {name!r}: the workload no longer matches the one the study "
            "was created with (its file changed?); create a new study"
        )
    if reset_running:
        fail_running(study, store, name)
    session = ControllerSession(
        store,
        study,
        cfg,
        bounds,
        seed_for=lambda n: sampler_seed(cfg.seed, n),
        constraint_names=attrs.constraint_names(cfg),
    )
    ctx = RunContext(
        cfg,
        store,
        study,
        bounds,
        wl,
        model,
        hw,
        workdir=workdir or study_workdir(cfg, name),
        session=session,
        on_event=on_event,
        plan=plan,
        hooks=hooks,
        n_trials=n_trials,
        timeout=cfg.strategy.timeout_s if timeout is None else timeout,  # the config's default
    )
    t0 = time.monotonic()
    report = asyncio.run(_run(ctx))
    if report.trials_run and hooks is not None:  # the dashboard's note and plots, as of now
        hooks.run_ended(study, cfg, rec, store, time.monotonic() - t0)
    if hooks is not None and hooks.record is not None:
        # the validation and the recommendation, also after a run that only validated
        hooks.record(cfg, store, True)
    return report
