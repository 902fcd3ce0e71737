"""``stored_trial``: one sim-virtual trial of a small study, run and stored with or without
its per-request records (``record.requests``), for the tests of the per-request exports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.profiles.hardware import get_hardware
from autotune.store import LevelRecord, Store
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.trial import TrialSetup, run_trial
from autotune.tuning.search.plan import model_of
from autotune.workload.build import build_workload

from .databases import make_study
from .studies import config

__all__ = ["stored_trial"]


async def stored_trial(folder: Path, keep: bool) -> tuple[str, dict[int, LevelRecord]]:
    """The database URL and the stored levels by index of trial 0 of study ``t``: a
    capacity search whose capacity lies inside the lattice, so it measures several levels
    on both sides of it (about half a second)."""
    cfg, text = config(
        workload={"num_prompts": 40, "output_len": 32},
        slo={"p99_ttft_ms": 200, "p99_tpot_ms": 20},
        record={"requests": keep},
    )
    url = f"sqlite:///{folder / 'a.db'}"
    with Store.open(url) as store:
        store.create_study(dataclasses.replace(make_study(cfg.name), config_yaml=text))
        runner = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), folder)
        setup = TrialSetup(cfg, runner, build_workload(cfg.workload), store, cfg.name)
        out = await run_trial(
            setup, number=0, stage="baseline", params={}, engine_args={"max_num_seqs": 16}
        )
        assert out.record.feasible and len(out.record.levels) >= 3
        (rec,) = store.trials(cfg.name)
    return url, {lv.level_index: lv for lv in rec.levels}
