"""The server's noise and the "too noisy to tell" verdict (autotune/tuning/measure/noise.py,
verdict.py; docs/tuning.md#7-validation): the band's definition, pure verdicts against it,
the record a sim-virtual study stores once (a resumed study does not measure it again), and a
scripted server whose throughput varies 20 % from run to run, whose study ends "too-noisy"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from support.runners import NoisyRunner
from support.studies import config

from autotune.failures import FailureMatch
from autotune.loadgen.level import LevelMetrics
from autotune.nightly.decide import decide
from autotune.report.recommend import recommend
from autotune.store import Store
from autotune.tuning.measure.interval import Run, ValidationSummary, summarize
from autotune.tuning.measure.noise import NoiseRecord, NoiseRun, band_of
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.runner_protocol import StartInfo
from autotune.tuning.run import context, controller, create
from autotune.tuning.study_attrs import NOISE_KEY, VALIDATION_KEY, read_noise, stored_noise
from autotune.workload.core import Workload


def _run(tps: float, headroom: float | None = 1.0, held: bool = True) -> NoiseRun:
    return NoiseRun(held, tps, 1000.0, 20.0, headroom)


def _noise(band: float) -> NoiseRecord:
    """A record whose band is ``band`` percent (from the throughput spread)."""
    return band_of(0, 1.0, [_run(100.0 - band / 2), _run(100.0 + band / 2), _run(100.0)], 1.0)


# ---- the band ---------------------------------------------------------------------------


def test_the_band_is_the_larger_spread_and_a_step_when_feasibility_differs() -> None:
    # output tok/s 100, 102, 104: spread 8 / 102 = 3.92 %; headroom 1.00 … 1.01: 1 %
    rec = band_of(3, 1.5, [_run(100, 1.0), _run(102, 1.01), _run(104, 1.005)], 1.0)
    assert rec.throughput_spread_pct == pytest.approx(100 * 4 / 102)
    assert rec.headroom_spread_pct == pytest.approx(100 * 0.01 / (3.015 / 3))
    assert rec.band_pct == pytest.approx(rec.throughput_spread_pct)
    assert not rec.disagree
    # the headroom spread binds when it is the larger
    rec = band_of(3, 1.5, [_run(100, 1.0), _run(100, 1.2), _run(100, 1.1)], 1.0)
    assert rec.band_pct == pytest.approx(100 * 0.2 / 1.1)
    # identical runs that disagree on feasibility: at least one lattice step
    rec = band_of(3, 1.5, [_run(100), _run(100, held=False), _run(100)], 2.0)
    assert rec.disagree and rec.band_pct == 2.0
    assert "feasibility differed" in rec.text() and "held in 2 of 3" in rec.text()
    # offline: no latency SLO, no headroom
    rec = band_of(3, 1.0, [_run(100, None), _run(101, None), _run(100, None)], 1.0)
    assert rec.headroom_spread_pct is None and rec.band_pct == pytest.approx(100 / (301 / 3))


def test_an_early_stopped_runs_figures_stay_out_of_the_band() -> None:
    # a run stopped early (docs/tuning.md#10-early-stop-inside-a-level) served only the part
    # it replayed: its throughput (here half) is no measure of the server's noise; the
    # disagreement on feasibility still puts the band at one lattice step at least
    stopped = NoiseRun(False, 50.0, 5000.0, 20.0, 0.6, whole=False)
    rec = band_of(3, 1.5, [_run(100, 1.0), stopped, _run(100.5, 1.002)], 1.0)
    assert rec.throughput_spread_pct == pytest.approx(100 * 0.5 / 100.25)
    assert rec.band_pct == pytest.approx(1.0) and rec.disagree
    assert "1 stopped early, figures left out" in rec.text() and "50" not in rec.text()
    assert NoiseRecord.from_dict(rec.to_dict()) == rec


def test_the_record_round_trips_through_its_stored_form() -> None:
    rec = band_of(3, 1.5, [_run(100, 1.0), _run(102, None, held=False), _run(104, 1.1)], 1.0)
    back = NoiseRecord.from_dict(rec.to_dict())
    assert back == rec and read_noise({NOISE_KEY: rec.to_dict()}) == rec
    assert read_noise({}) is None


# ---- pure verdicts ----------------------------------------------------------------------


def _runs(**configs: Sequence[float | None]) -> list[Run]:
    """Runs of a complete plan: t0 the baseline; capacities per repeat (None: SLOs broken)."""
    return [
        Run(r, int(name[1:]), name == "t0", x is not None, x, 0.0, 100)
        for name, xs in configs.items()
        for r, x in enumerate(xs)
    ]


def _summary(runs: list[Run], noise: NoiseRecord | None) -> ValidationSummary:
    return summarize(
        runs,
        mode="slo-capacity",
        baseline_trial=0,
        repeats=max(r.repeat for r in runs) + 1,
        runs_planned=len(runs),
        confidence=0.95,
        sd_floor=0.1,
        max_overlength_rate=0.01,
        study_held={0: True, 1: True, 2: True},
        noise=noise,
    )


BASE = [1.0, 1.0, 1.0, 1.0, 1.0]
PLUS3 = [1.03, 1.031, 1.029, 1.03, 1.03]  # +3 %, a tight interval above 0
MINUS6 = [0.94, 0.941, 0.939, 0.94, 0.94]  # -6 %


def test_a_gain_inside_the_band_is_too_noisy_never_keep_nor_a_winner() -> None:
    s = _summary(_runs(t0=BASE, t1=PLUS3), _noise(5.0))
    assert (s.verdict, s.chosen) == ("too-noisy", None)
    assert s.noise_band_pct == pytest.approx(5.0)
    # the reason gives the figures: the gain, its interval and runs, the band and its runs
    assert s.reason is not None and s.reason.startswith("too noisy to tell on this server")
    assert "trial 1 +3.0 %" in s.reason and "5 paired runs" in s.reason
    assert "noise band is 5.0 %" in s.reason and "measured 3 times" in s.reason
    # without a band the same runs recommend it (a study from before the noise was measured)
    assert _summary(_runs(t0=BASE, t1=PLUS3), None).verdict == "recommend"


def test_a_gain_beyond_the_band_is_recommended() -> None:
    s = _summary(_runs(t0=BASE, t1=PLUS3, t2=MINUS6), _noise(2.0))
    assert (s.verdict, s.chosen) == ("recommend", 1)
    assert "beyond the noise band; the server's noise band is 2.0 %" in (s.reason or "")


def test_keep_needs_every_candidate_worse_beyond_the_band() -> None:
    s = _summary(_runs(t0=BASE, t1=MINUS6, t2=[0.9] * 5), _noise(2.0))
    assert (s.verdict, s.chosen) == ("keep", None)
    assert s.reason is not None and "worse beyond noise" in s.reason
    # one candidate only -1 % worse, inside a 2 % band: not "keep", too noisy to tell
    s = _summary(_runs(t0=BASE, t1=MINUS6, t2=[0.99] * 5), _noise(2.0))
    assert s.verdict == "too-noisy" and "trial 2 -1.0 %" in (s.reason or "")
    # a candidate that broke its SLOs does not stand in the way of "keep"
    s = _summary(_runs(t0=BASE, t1=MINUS6, t2=[1.2, None, 1.2, 1.2, 1.2]), _noise(2.0))
    assert s.verdict == "keep" and "trial 2 held the SLOs only" in (s.reason or "")


def test_the_nightly_promotes_nothing_and_keeps_nothing_when_too_noisy() -> None:
    s = _summary(_runs(t0=BASE, t1=PLUS3), _noise(5.0))
    d = decide(s, [], 0.0)
    assert d.kind == "too-noisy" and d.exit_code == 0
    assert d.reason.startswith("too noisy to tell")
    assert decide(_summary(_runs(t0=BASE, t1=PLUS3), _noise(1.0)), [], 0.0).kind == "promote"


# ---- measuring it -----------------------------------------------------------------------


class Jumpy(NoisyRunner):
    """A server whose throughput and latency move by up to 20 % from run to run, on every
    config alike (every level draws a fresh factor, so the same level repeated differs): its
    true capacities differ by 3 % per max_num_seqs step at most, far inside that noise."""

    def __init__(self, seed: int, log: list[Any]) -> None:
        super().__init__(seed, {}, log)
        self.rng = np.random.default_rng(seed)
        self.true = 1.0

    async def start(self, engine_args: Any, trial_name: str) -> StartInfo:
        self.key = int(engine_args["max_num_seqs"])
        self.true = 1.0 + 0.03 * (self.key % 2)  # two behaviours, 3 % apart
        self.log.append(("start", self.key, trial_name))
        return StartInfo("vllm serve fake", ["vllm"], 0.0, 1000, 10.0)

    async def run_level(self, workload: Workload, scale: float, progress: Any = None) -> Any:
        f = float(self.rng.uniform(0.8, 1.2))  # 20 % swings, run to run
        cap = self.true * f
        self.log.append(("level", self.key, scale))
        ok = scale <= cap
        m = LevelMetrics(
            completed=100,
            failed=0,
            p99_ttft_ms=1000.0 if ok else 5000.0,
            p99_tpot_ms=20.0,
            output_throughput=1000.0 * scale * f,
            request_throughput=scale,
        )
        return LevelOutcome(scale, 4.0 * scale, m)

    def failure(self) -> FailureMatch | None:
        return None


def _study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, **strategy: Any
) -> tuple[Store, Any]:
    monkeypatch.setattr(context, "make_runner", make)
    st = {"name": "joint", "n_trials": 5, "capacity_levels": 6, **strategy}
    cfg, text = config(strategy=st)
    store = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    create.create_study(cfg, text, store)
    return store, cfg


def test_a_sim_virtual_study_stores_the_noise_once(tmp_path: Path) -> None:
    """The real in-process simulator: the record is the baseline's boundary level, 3 runs
    with fresh jitter (a small band, not 0); a resumed run does not measure it again."""
    cfg, text = config(strategy={"name": "joint", "n_trials": 3, "capacity_levels": 6})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create.create_study(cfg, text, store)
        first = controller.run_study("t", store, n_trials=2)
        assert first.trials_run == 2
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        rec = read_noise(study)
        assert rec is not None and stored_noise(store, "t") == rec
        base = next(t for t in store.trials("t") if t.stage == "baseline")
        assert rec.trial == base.optuna_trial_number
        assert base.capacity_scale is not None
        assert math.isclose(rec.scale, base.capacity_scale, rel_tol=1e-9)
        assert len(rec.runs) == 3
        # the first run is the search's own level; the others drew fresh jitter
        at = next(lv for lv in base.levels if math.isclose(lv.scale, rec.scale, rel_tol=1e-9))
        assert rec.runs[0].output_tok_s == at.output_throughput
        assert len({(r.output_tok_s, r.headroom) for r in rec.runs}) == 3
        assert 0 < rec.band_pct < 10  # the simulator's 1.5 % step jitter
        # the extra runs are not trial levels: the baseline's levels are its search's
        assert len(base.levels) <= 6
        stamp = study.user_attrs[NOISE_KEY]
        second = controller.run_study("t", store)
        assert second.trials_run == 1
        again = optuna.load_study(study_name="t", storage=store.optuna_storage())
        assert again.user_attrs[NOISE_KEY] == stamp  # measured once


def test_a_study_on_a_server_whose_throughput_varies_20_percent_ends_too_noisy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[Any] = []
    store, cfg = _study(
        tmp_path,
        monkeypatch,
        lambda c, *_, **__: Jumpy(c.seed, log),
        validate={"top_k": 2, "repeats": 3},
    )
    with store:
        controller.run_study("t", store)
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        noise = read_noise(study)
        v = study.user_attrs[VALIDATION_KEY]
        rec = recommend(cfg, store.trials("t"), store.repeats("t"), noise)
    assert noise is not None and noise.band_pct > 5
    assert v["verdict"] == "too-noisy" and v["chosen"] is None
    assert v["noise_band_pct"] == pytest.approx(noise.band_pct)
    assert "too noisy to tell on this server" in v["reason"]
    assert f"noise band is {noise.band_pct:.1f} %" in v["reason"]
    # the readers that recompute the summary agree: no winner, no "keep", no command
    assert rec is not None and rec.undecided and not rec.keep
    assert rec.validation is not None and rec.validation.verdict == "too-noisy"
    # without the stored band the same runs would have been judged otherwise
    plain = recommend(cfg, store.trials("t"), store.repeats("t"))
    assert plain is not None and plain.validation is not None
    assert plain.validation.verdict != "too-noisy"
