"""The twin strategy on sim-virtual: a twin started from deliberately wrong constants is
refitted to the real worker's levels and steers the real trials to the real optimum
(docs/tuning.md#15-the-twin-strategy)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.cli_main import run_main
from support.studies import config

from autotune.calibrate import Probe, predict
from autotune.errors import ConfigError
from autotune.report.twin_summary import twin_lines
from autotune.sim import EngineArgs, Measured, TwinFile, dump_twin, hardware_of, load_twin
from autotune.store import Store, TrialRecord
from autotune.tuning import attrs, study_attrs
from autotune.tuning.measure.protocol import Protocol, measure_config
from autotune.tuning.measure.twin_round import affordable, level_targets, screen
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study, study_workload, twin_warnings
from autotune.tuning.run.events import Event, TwinRound
from autotune.tuning.run.twin_refresh import twin_start
from autotune.tuning.search.plan import build_bounds, model_of

# the real worker is A100-80GB; the twin starts 2x slower on weights and 4x on overhead
WRONG = TwinFile(
    autotune_twin=1,
    base="A100-80GB",
    hardware={"eta_bw": 0.4},
    cost={"t_fixed": 3e-3},
    front_end={"per_request": 1e-3},
)
SLO = {"p99_ttft_ms": 3000, "p99_tpot_ms": 30}
# a round's budget: at 6 and at 8 s the best config measured was within 1.1 % of the optimum
# (the test's 15 s before took twice the time); at 3 s a round overran it by more than half
SCREEN_CPU_S = 8.0


def twin_config(tmp_path: Path, validate: bool = True, **twin: Any) -> tuple[Any, str]:
    path = tmp_path / "wrong.yaml"
    path.write_text(dump_twin(WRONG))
    strategy = {
        "name": "twin",
        "validate": {"enabled": validate},
        "capacity_levels": 12,
        "capacity_high": 16.0,
        "twin": {"profile": f"file:{path}", "real_trials": 4, "screen_cpu_s": SCREEN_CPU_S, **twin},
    }
    return config(slo=SLO, strategy=strategy)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as s:
        yield s


@pytest.mark.config_field("strategy.twin.profile")
@pytest.mark.config_field("strategy.twin.screen_cpu_s")
def test_a_wrong_twin_is_refitted_and_finds_the_real_optimum(store: Store, tmp_path: Path) -> None:
    cfg, text = twin_config(tmp_path)
    create_study(cfg, text, store)
    rounds: list[TwinRound] = []

    def seen(e: Event) -> None:
        if isinstance(e, TwinRound):
            rounds.append(e)

    report = run_study("t", store, on_event=seen)
    assert report.stopped_by == "plan complete"
    trials = store.trials("t")
    assert trials[0].stage == "baseline"
    assert {t.stage for t in trials[1:]} == {"twin"} and 1 <= len(trials) - 1 <= 4
    # a round ran after every measured trial; the last one said why the search ends
    assert len(rounds) == len(trials) and rounds[-1].stop is not None
    assert all(r.cpu_s <= SCREEN_CPU_S * 1.5 for r in rounds), [r.cpu_s for r in rounds]
    # each fit replayed the latest levels its share of the round afforded, one at least
    assert all(1 <= r.levels_fitted <= r.levels for r in rounds)
    assert rounds[-1].levels > rounds[0].levels  # the first twin trial's levels joined
    # every twin trial carries the twin's prediction beside its measurement
    study = optuna.load_study(study_name="t", storage=store.optuna_storage())
    for ft in study.trials[1:]:
        pred = attrs.twin_prediction(ft)
        assert pred is not None and ft.value is not None
        assert abs(pred / ft.value - 1) < 0.05  # refitted: within 5 % of what it measured
    assert attrs.twin_prediction(study.trials[0]) is None
    stored = study_attrs.read_twin(study)
    assert stored is not None and stored["trials_seen"] == len(trials)
    assert max(stored["residual_pct"].values()) < 5
    # the real optimum: 30 configs screened on the real worker's own profile (by count, so
    # the same on every host; 53 configs in 25 s of CPU found the same best)
    model = model_of(cfg)
    wl = study_workload(cfg, vocab_size=model.vocab_size)
    bounds = build_bounds(cfg, model, wl.profile(), 0)
    real = hardware_of("A100-80GB")
    truth = screen(cfg, real, wl, bounds, cpu_s=600, max_configs=30)[0][1]
    best = max(t.objective or 0.0 for t in trials)
    assert best >= 0.97 * truth, (best, truth)
    # the wrong twin alone, unfitted, would have predicted a third of that
    wrong = screen(cfg, load_twin(f"file:{tmp_path / 'wrong.yaml'}").hardware, wl, bounds, cpu_s=5)
    assert wrong[0][1] < 0.5 * truth
    proto = Protocol(cfg.strategy.capacity_resolution, 0.0)
    pick = asyncio.run(measure_config(cfg, wrong[0][0], proto, workload=wl, hardware=real))
    assert pick.objective < truth
    # the levels a fit can afford: the latest trial's at no CPU, every trial's at plenty
    targets, observed = level_targets(cfg, wl, trials)
    latest = [t for t in targets if t.name.startswith(f"trial{trials[-1].optuna_trial_number}@")]
    assert 1 <= len(latest) < len(targets)
    one, seen = affordable(targets, observed, model, real, 0.0)
    assert one == latest and {o.probe for o in seen} == {t.name for t in latest}
    assert affordable(targets, observed, model, real, 1e6) == (targets, observed)


@pytest.mark.config_field("strategy.twin.real_trials")
def test_real_trials_caps_the_twin_trials(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no validation phase: not what this test is about (1.4 s of its 15)
    cfg, text = twin_config(tmp_path, validate=False, real_trials=1, screen_cpu_s=3.0)
    create_study(cfg, text, store)
    run_study("t", store)
    trials = store.trials("t")
    assert [t.stage for t in trials] == ["baseline", "twin"]
    # `study show` puts the twin's prediction beside the measurement
    url = f"sqlite:///{tmp_path / 'a.db'}"
    code, out, err = run_main(["study", "show", "t", "--storage", url], capsys)
    assert code == 0, err
    assert "twin: trial 1 " in out and f"{trials[1].objective:,.1f} measured" in out
    assert "median error" in out and "twin: last fit's median error per level figure" in out


def test_twin_lines_put_each_prediction_beside_its_measurement() -> None:
    def trial(n: int, objective: float) -> TrialRecord:
        return TrialRecord(
            "t", n, "twin", "COMPLETE", {}, {}, None, None, "sim-virtual", objective=objective
        )

    lines = twin_lines(
        {"residual_pct": {"itl": 1.25}, "stop": "nothing left"},
        {1: 110.0, 2: 95.0},
        [trial(0, 100.0), trial(1, 100.0), trial(2, 100.0)],
    )
    assert lines == [
        "twin: trial 1 110.0 predicted, 100.0 measured (+10.0 %); trial 2 95.0 predicted, "
        "100.0 measured (-5.0 %); median error 7.5 % over 2 trial(s)",
        "twin: last fit's median error per level figure: itl 1.2 %; the search stopped: "
        "nothing left",
    ]
    assert twin_lines(None, {}, [trial(0, 1.0)]) == []


def test_the_twin_profile_must_be_a_calibrated_profile_file() -> None:
    with pytest.raises(ConfigError, match=r"strategy\.twin\.profile.*file:PATH") as err:
        config(strategy={"name": "twin", "twin": {"profile": "H100-80GB"}})
    assert str(err.value).startswith("test.yaml:")  # the file and the line


def test_the_twin_starts_from_the_profile_else_the_studys_hardware(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(dump_twin(WRONG))
    assert twin_start(None, "H100-80GB") == ("H100-80GB", None)
    assert twin_start(f"file:{path}", "H100-80GB") == ("A100-80GB", WRONG)
    assert twin_start(None, f"file:{path}") == ("A100-80GB", WRONG)


def test_a_profile_fitted_on_another_model_is_warned_at_create(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "w.yaml"
    elsewhere = WRONG.model_copy(update={"measured": Measured(vllm="0.31.0", model="other/model")})
    path.write_text(dump_twin(elsewhere))
    cfg, text = config(strategy={"name": "twin", "twin": {"profile": f"file:{path}"}})
    rec = create_study(cfg, text, store)
    assert rec.workload_profile["warnings"] == [
        f"the calibrated profile file:{path} was fitted elsewhere: vLLM 0.32.0 here, 0.31.0 "
        "fitted; model meta-llama/Llama-3.1-8B-Instruct here, other/model fitted"
    ]
    assert twin_warnings(config()[0]) == []  # no calibrated profile, nothing to say


def test_calibrate_from_study_fits_the_stored_levels(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`autotune calibrate --from-study`: a study measured on the real profile; the fit,
    started from the wrong one, comes back near the real worker's step."""
    cfg, text = config(slo=SLO, strategy={"name": "joint", "n_trials": 1, "capacity_levels": 8})
    create_study(cfg, text, store)
    run_study("t", store)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(dump_twin(WRONG))
    out = tmp_path / "fitted.yaml"
    url = f"sqlite:///{tmp_path / 'a.db'}"
    args = ["calibrate", "--from-study", "t", "--storage", url, "--hardware", f"file:{wrong}"]
    args += ["--fit-starts", "1"]
    code, stdout, err = run_main([*args, "--out", str(out)], capsys)
    assert code == 0, err
    assert f"wrote {out}" in stdout
    fitted = load_twin(f"file:{out}")
    assert fitted.spec.base == "A100-80GB"
    assert max(fitted.spec.residuals.values()) < 5
    # one decode step of 64 sequences: the fit lands near the real profile's, far from the
    # wrong start's
    unseen = [Probe("concurrency", 512, 64, requests=64, concurrency=64)]
    args_ = EngineArgs(max_model_len=2048)
    model = model_of(cfg)
    gap = {
        name: next(o.value for o in predict(unseen, model, hw, args_) if o.metric == "itl")
        for name, hw in (
            ("real", hardware_of("A100-80GB")),
            ("fitted", fitted.hardware),
            ("wrong", load_twin(f"file:{wrong}").hardware),
        )
    }
    assert abs(gap["fitted"] / gap["real"] - 1) < 0.1
    assert gap["wrong"] > 1.3 * gap["real"]
    code, _, err = run_main(["calibrate", "--from-study", "nope", "--storage", url], capsys)
    assert code == 4 and "no study named 'nope'" in err


def test_a_round_line_says_when_the_fit_replayed_only_the_latest_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autotune.cli.progress import progress_printer

    show = progress_printer()
    fit = {"itl": 0.2, "ttft": 0.3}
    show(TwinRound(fit, 8, 7.7, None, -10.6, "inside the noise band", 3, 6))
    show(TwinRound(fit, 10, 7.6, {"max_num_seqs": 64}, 57.6, None, 3, 3))
    assert capsys.readouterr().out.splitlines() == [
        "twin: fit error itl 0.2 %, ttft 0.3 % (3 of 6 levels); screened 8 configs in 8 s of "
        "CPU; stops: inside the noise band",
        "twin: fit error itl 0.2 %, ttft 0.3 %; screened 10 configs in 8 s of CPU; next: "
        "max_num_seqs=64 (predicted +57.6 % on the best measured)",
    ]
