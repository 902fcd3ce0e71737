"""Calibrated profiles (autotune.sim.twin; docs/simulator.md#10-calibrated-profiles): the file
round-trips, its overrides reach the simulated engine, a bad line is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_main import run_main
from support.studies import config

from autotune.errors import ConfigError
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import (
    DEFAULT_FRONT_END,
    EngineArgs,
    SimRequest,
    TwinFile,
    dump_twin,
    is_twin_name,
    load_twin,
    simulate,
)
from autotune.sim.costs import DEFAULT_T_FIXED, CostModel
from autotune.store import Store
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study

LLAMA = get_model("meta-llama/Llama-3.1-8B-Instruct")
SPEC = TwinFile(
    autotune_twin=1,
    base="H100-80GB",
    hardware={"eta_bw": 0.7},
    cost={"t_fixed": 0.001},
    front_end={"per_request": 0.004},
    measured={"vllm": "0.32.0", "model": LLAMA.name, "host": "gpu-7", "when": "2026-12-04"},
    uncertainty={"t_fixed": 0.0001},
    residuals={"throughput": 4.2},
)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "twin.yaml"
    p.write_text(text)
    return p


def test_a_profile_file_round_trips(tmp_path: Path) -> None:
    p = _write(tmp_path, dump_twin(SPEC))
    twin = load_twin(f"file:{p}")
    assert twin.spec == SPEC and is_twin_name(twin.name) and twin.source == str(p)
    assert twin.hardware.eta_bw == 0.7
    assert twin.hardware.mem_bw == get_hardware("H100-80GB").mem_bw  # the rest is the base's
    assert twin.cost == {"t_fixed": 0.001}
    assert twin.front_end.per_request == 0.004
    assert twin.front_end.per_output_token == DEFAULT_FRONT_END.per_output_token
    assert "gpu-7" in twin.text() and "throughput ±4 %" in twin.text()


def test_its_overrides_reach_the_engine(tmp_path: Path) -> None:
    twin = load_twin(_write(tmp_path, dump_twin(SPEC)))
    base = CostModel.build(LLAMA, get_hardware("H100-80GB"))
    # the profile carries its own step-cost constants: nothing else is passed
    tuned = CostModel.build(LLAMA, twin.hardware)
    assert tuned.t_mem_w == pytest.approx(base.t_mem_w * 0.8 / 0.7)  # eta_bw 0.8 -> 0.7
    assert tuned.step_overhead - base.step_overhead == pytest.approx(0.001 - DEFAULT_T_FIXED)
    req = [SimRequest(500, 10)]
    args = EngineArgs(max_model_len=4096)
    plain = simulate(LLAMA, get_hardware("H100-80GB"), args, req, jitter_cv=0).requests[0]
    cal = simulate(LLAMA, twin.hardware, args, req, jitter_cv=0).requests[0]
    # the API server's request cost and the slower steps both show in the TTFT
    extra = 0.004 - DEFAULT_FRONT_END.per_request
    assert cal.scheduled - plain.scheduled == pytest.approx(extra)
    assert cal.ttft > plain.ttft + extra and cal.tpot > plain.tpot


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (("t_fixed: 0.001", "t_fixd: 0.001"), "twin.yaml:5: cost: unknown cost constant(s)"),
        (("eta_bw: 0.7", "eta_bw: -0.7"), "twin.yaml:3: hardware: hardware constant(s)"),
        (("base: H100-80GB", "base: H900"), "twin.yaml:2: base: unknown hardware profile"),
        (("autotune_twin: 1", "autotune_twin: 2"), "twin.yaml:1: autotune_twin:"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, edit: tuple[str, str], line: str) -> None:
    text = dump_twin(SPEC)
    assert edit[0] in text
    p = _write(tmp_path, text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError) as err:
        load_twin(f"file:{p}")
    assert str(err.value).startswith(f"{tmp_path}/{line}"), str(err.value)


def test_sim_run_takes_a_calibrated_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _write(tmp_path, dump_twin(SPEC))
    argv = ["sim", "run", LLAMA.name, "--num-requests", "20", "--max-model-len", "4096"]
    code, out, _ = run_main([*argv, "--hardware", f"file:{p}"], capsys)
    assert code == 0 and "simulated on the calibrated profile" in out.replace("\n", " ")
    assert "planned on the simulator" not in out
    code, out, _ = run_main([*argv, "--hardware", "H100-80GB"], capsys)
    assert code == 0 and "planned on the simulator" in out.replace("\n", " ")


def test_a_study_runs_on_a_calibrated_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hardware: file:PATH`` in a study config: the trials run on the profile's constants,
    and `study best` states the profile's line, not the published rows' error."""
    slow = SPEC.model_copy(update={"base": "A100-80GB", "cost": {"t_fixed": 0.004}})
    p = _write(tmp_path, dump_twin(slow))
    url = f"sqlite:///{tmp_path / 's.db'}"
    quick = {"n_trials": 1, "validate": {"enabled": False}}
    objective = {}
    for name, hardware in (("base", "A100-80GB"), ("twin", f"file:{p}")):
        cfg, text = config(name=name, hardware=hardware, strategy=quick)
        with Store.open(url) as store:
            create_study(cfg, text, store)
            run_study(name, store)
            (t,) = store.trials(name)
        objective[name] = t.objective
    # 4 ms of CPU per engine step instead of 0.7: the same baseline serves less
    assert objective["twin"] < 0.9 * objective["base"]
    code, out, _ = run_main(["study", "best", "twin", "--storage", url], capsys)
    assert code == 0 and "simulated on the calibrated profile" in out.replace("\n", " ")
    assert "planned on the simulator:" not in out
    p.unlink()  # moved since: the line says so, and nothing fails
    code, out, _ = run_main(["study", "best", "twin", "--storage", url], capsys)
    assert code == 0 and "not readable now" in out.replace("\n", " ")


def test_a_sim_worker_gets_the_profiles_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.workers.sim_worker import SimWorker

    _write(tmp_path, dump_twin(SPEC))
    monkeypatch.chdir(tmp_path)
    w = SimWorker(model=LLAMA.name, hardware="file:twin.yaml", workdir=tmp_path / "w")
    # the server runs in its own working directory: a relative path would not reach it
    assert w.hardware == f"file:{tmp_path / 'twin.yaml'}"
    assert load_twin(w.hardware).spec == SPEC
