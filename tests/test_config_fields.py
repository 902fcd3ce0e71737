"""Every field of the study config does something, and a test shows what.

Each field has at least one behavioural test marked ``config_field("<dotted path>")``, here or
elsewhere in the suite. :func:`test_every_config_field_has_a_marked_test` collects the whole
suite in a subprocess and fails for a field no collected test marks, and for a marker that
names no field: a new field needs its test, a removed one takes its marker along.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from pydantic import BaseModel
from support import config_marks
from support.studies import config

from autotune.config import StudyConfig, parse_config
from autotune.errors import ConfigError, WorkerStartupError
from autotune.loadgen.level import LevelMetrics
from autotune.profiles.hardware import get_hardware
from autotune.report.recommend import recommend
from autotune.store import Store, TrialRecord
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.tuning.measure.runner_factory import make_runner
from autotune.tuning.measure.scoring import Slo, score_level
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.search.plan import build_bounds, model_of
from autotune.tuning.search.space import PARAM_ORDER, mnbt_engine_value, mnbt_range
from autotune.tuning.search.stages import stage_plan
from autotune.tuning.study_attrs import read_header
from autotune.workers.env import worker_environment
from autotune.workers.vllm import WorkerInfo
from autotune.workload.build import build_workload

ROOT = Path(__file__).resolve().parents[1]
field = pytest.mark.config_field


def config_fields(model: type[BaseModel] = StudyConfig, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf field (sections and lists of sections are walked)."""
    out: list[str] = []
    for attr, info in model.model_fields.items():
        name = info.alias or attr  # as the YAML spells it (strategy.validate)
        ann = info.annotation
        subs = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type)]
        sub = next((a for a in subs if issubclass(a, BaseModel)), None)
        out += config_fields(sub, f"{prefix}{name}.") if sub else [prefix + name]
    return out


def collected_marks(config: pytest.Config) -> list[dict[str, Any]]:
    """``config_field`` markers of every test pytest collects under tests/: this session's when
    it collected the whole suite (tests/support/config_marks.py), else a subprocess's, so what
    this session selected does not matter."""
    if config_marks.MARKS in config.stash:
        return config.stash[config_marks.MARKS]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"config-fields-{os.getpid()}.json"
    env = {**os.environ, config_marks.ENV: str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    try:
        marks: list[dict[str, Any]] = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return marks


def test_config_fields_walk_every_section() -> None:
    fields = config_fields()
    assert "name" in fields and "strategy.capacity_resolution" in fields
    assert "search.max_model_len.candidates" in fields and "search.extra.choices" in fields
    assert "workload" not in fields and "search.max_model_len" not in fields
    assert "strategy.validate.repeats" in fields  # an aliased field, as YAML spells it
    # removed: they did nothing
    assert "workload.duration_s" not in fields and "search.max_model_len.log" not in fields


def test_every_config_field_has_a_marked_test(pytestconfig: pytest.Config) -> None:
    fields = set(config_fields())
    marks = collected_marks(pytestconfig)
    bad = [m["test"] for m in marks if m["n_args"] != 1]
    assert not bad, f"config_field takes exactly one dotted path: {bad}"
    named = {m["args"][0] for m in marks}
    unknown = sorted(named - fields)
    assert not unknown, f"config_field markers that name no config field: {unknown}"
    missing = sorted(fields - named)
    assert not missing, f"config fields without a marked behavioural test: {missing}"


# -- top level -------------------------------------------------------------------------------
@field("name")
def test_name_names_the_stored_study(tmp_path: Path) -> None:
    cfg, text = config(name="chat.v2-a")
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        assert store.get_study("chat.v2-a") is not None
    with pytest.raises(ConfigError, match="name"):
        config(name="two words")


@field("model.name")
@field("hardware")
async def test_model_and_hardware_pick_the_simulated_engine(tmp_path: Path) -> None:
    kv = {}
    for model, hw in (
        ("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB"),
        ("Qwen/Qwen2.5-7B-Instruct", "A100-80GB"),
        ("meta-llama/Llama-3.1-8B-Instruct", "L40S"),
    ):
        cfg, _ = config(model={"name": model}, hardware=hw)
        r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
        info = await r.start({"max_model_len": 2048}, "t")
        assert info.command.startswith(f"vllm serve {model} ")
        kv[(model, hw)] = info.kv_cache_tokens
    # Qwen's KV per token is under half of Llama's; an L40S has about half the memory
    assert len(set(kv.values())) == 3
    assert (
        kv[("Qwen/Qwen2.5-7B-Instruct", "A100-80GB")]
        > 2 * kv[("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB")]
    )


@field("model.config_json")
def test_config_json_overrides_the_profile(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "max_position_embeddings": 8192,
        "num_attention_heads": 16,
        "num_hidden_layers": 12,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(hf))
    cfg, _ = config(model={"name": "mine", "config_json": str(folder)})
    m = model_of(cfg)
    assert m.name == "mine" and m.num_layers == 12 and m.max_position_embeddings == 8192


@field("model.served_name")
def test_served_name_is_what_clients_ask_for(tmp_path: Path) -> None:
    cfg, _ = config(model={"served_name": "chat"}, worker={"kind": "sim"})
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    assert isinstance(r, HttpRunner) and r.model_name == "chat"
    best = TrialRecord(
        "t", 0, "baseline", "COMPLETE", {}, {"max_num_seqs": 8}, None, None, "sim", objective=1.0
    )
    best.feasible = True
    rec = recommend(cfg, [best])
    assert rec is not None and "--served-model-name chat" in rec.command


@field("enqueue")
@field("seed")
def test_enqueued_configs_run_first_and_the_seed_fixes_the_samples(tmp_path: Path) -> None:
    args = []
    for i, seed in enumerate((0, 0, 1)):
        cfg, text = config(
            seed=seed,
            enqueue=[{"max_num_seqs": 33}],
            strategy={"name": "random", "n_trials": 4, "capacity_levels": 3},
        )
        with Store.open(f"sqlite:///{tmp_path / f'{i}.db'}") as store:
            create_study(cfg, text, store)
            run_study("t", store)
            trials = store.trials("t")
        assert [t.stage for t in trials[:2]] == ["baseline", "enqueue-0"]
        assert trials[1].engine_args["max_num_seqs"] == 33
        args.append([t.engine_args for t in trials[2:]])
    assert args[0] == args[1] and args[0] != args[2]


@field("storage")
def test_storage_is_used_without_a_flag_or_variable(tmp_path: Path) -> None:
    db = tmp_path / "from-config.db"
    cfg_path = tmp_path / "s.yaml"
    _, text = config(storage=f"sqlite:///{db}", strategy={"n_trials": 1})
    cfg_path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_DATABASE_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "study", "create", "--config", str(cfg_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert db.exists() and not (tmp_path / "autotune.db").exists()
    with Store.open(f"sqlite:///{db}") as store:
        assert store.get_study("t") is not None


# -- mode and SLOs ---------------------------------------------------------------------------
@field("mode")
def test_mode_decides_the_levels(tmp_path: Path) -> None:
    levels = {}
    for mode in ("slo-capacity", "fixed-rate"):
        cfg, text = config(mode=mode, strategy={"n_trials": 1, "capacity_levels": 24})
        with Store.open(f"sqlite:///{tmp_path / f'{mode}.db'}") as store:
            create_study(cfg, text, store)
            run_study("t", store)
            levels[mode] = [lv.scale for lv in store.trials("t")[0].levels]
    assert levels["fixed-rate"] == [1.0]
    assert len(levels["slo-capacity"]) > 3 and levels["slo-capacity"][0] > 1.0


@field("slo.p99_ttft_ms")
@field("slo.p99_tpot_ms")
@field("slo.max_error_rate")
@field("slo.max_overlength_rate")
def test_slo_limits_decide_feasibility() -> None:
    m = LevelMetrics(
        96, 4, over_length=2, truncated=1, p99_ttft_ms=900.0, p99_tpot_ms=40.0, output_throughput=1
    )
    loose, _ = config(
        slo={
            "p99_ttft_ms": 1000,
            "p99_tpot_ms": 50,
            "max_error_rate": 0.02,
            "max_overlength_rate": 0.03,
        }
    )
    assert score_level(m, Slo.of(loose.slo)).feasible
    for key, value, text in (
        ("p99_ttft_ms", 800, "p99 TTFT 900 ms > 800 ms"),
        ("p99_tpot_ms", 30, "p99 TPOT 40 ms > 30 ms"),
        ("max_error_rate", 0.01, "errors 2.0 % > 1 %"),
        ("max_overlength_rate", 0.02, "over-length 3.0 % > 2 %"),
    ):
        tight, _ = config(slo=loose.slo.model_dump() | {key: value})
        ls = score_level(m, Slo.of(tight.slo))
        assert not ls.feasible and ls.texts == [text]


# -- worker ----------------------------------------------------------------------------------
FAKE_VLLM = textwrap.dedent(
    """
    import json, os, sys, time
    with open(os.environ["FAKE_OUT"], "w") as f:
        json.dump({"argv": sys.argv[1:], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
    print("INFO starting the fake server", flush=True)
    time.sleep(60)
    """
)


@field("worker.kind")
@field("worker.vllm_executable")
@field("worker.env")
@field("worker.gpus")
@field("worker.host")
@field("worker.startup_timeout_s")
@field("worker.workdir")
async def test_vllm_worker_launches_what_the_config_says(tmp_path: Path) -> None:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    out = tmp_path / "launched.json"
    cfg, _ = config(
        worker={
            "kind": "vllm",
            "vllm_executable": [sys.executable, str(script)],
            "env": {"FAKE_OUT": str(out)},
            "gpus": "3,5",
            "host": "127.0.0.3",
            "startup_timeout_s": 1.5,
            "workdir": str(tmp_path / "w"),
        }
    )
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path / "w")
    assert isinstance(r, HttpRunner) and r.kind == "vllm"
    t0 = time.monotonic()
    with pytest.raises(WorkerStartupError) as err:
        await r.start({"max_num_seqs": 8}, "trial-0000")
    assert 1.5 <= time.monotonic() - t0 < 20
    assert "1.5" in str(err.value) or "timeout" in str(err.value).lower()
    launched = json.loads(out.read_text())
    assert launched["gpus"] == "3,5"
    argv = launched["argv"]
    assert argv[:2] == ["serve", cfg.model.name]
    assert argv[argv.index("--host") + 1] == "127.0.0.3"
    assert (tmp_path / "w" / "trial-0000" / "worker.log").exists()
    vr = make_runner(config()[0], model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    assert isinstance(vr, VirtualRunner) and vr.kind == "sim-virtual"


@field("worker.static_args")
async def test_static_args_reach_every_launch(tmp_path: Path) -> None:
    cfg, _ = config(worker={"static_args": {"kv_cache_memory_bytes": 2 * 2**30}})
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    info = await r.start({"max_model_len": 2048}, "t")
    # 2 GiB of KV at 128 KiB per token
    assert info.kv_cache_tokens == 16384 and "--kv-cache-memory-bytes 2147483648" in info.command


@field("worker.jitter_cv")
async def test_jitter_cv_sets_the_step_noise(tmp_path: Path) -> None:
    out = {}
    for cv, seed in ((0.0, 0), (0.0, 1), (0.1, 0), (0.1, 1)):
        cfg, _ = config(worker={"jitter_cv": cv}, seed=seed, workload={"num_prompts": 60})
        r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
        await r.start({}, "t")
        out[(cv, seed)] = (await r.run_level(build_workload(cfg.workload), 1.0)).metrics
    assert out[(0.0, 0)] == out[(0.0, 1)]  # no noise: the seed does not matter
    assert out[(0.1, 0)] != out[(0.1, 1)] and out[(0.1, 0)] != out[(0.0, 0)]


@field("worker.time_scale")
@field("worker.sim_startup_delay_s")
def test_sim_worker_flags_reach_the_simulated_server(tmp_path: Path) -> None:
    cfg, _ = config(worker={"kind": "sim", "time_scale": 25.0, "sim_startup_delay_s": 0.4})
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    assert isinstance(r, HttpRunner) and r.time_scale == 25.0

    async def start() -> float:
        try:
            info = await r.start({"max_num_seqs": 8}, "t")
            assert "--time-scale 25.0" in info.command
            return info.startup_s
        finally:
            await r.stop()

    assert asyncio.run(start()) >= 0.4


# -- workload --------------------------------------------------------------------------------
def _lengths(**workload: Any) -> tuple[np.ndarray, np.ndarray]:
    cfg, _ = config(workload=workload)
    wl = build_workload(cfg.workload)
    return (
        np.array([r.prompt_len for r in wl.requests]),
        np.array([r.output_len for r in wl.requests]),
    )


@field("workload.num_prompts")
@field("workload.input_len")
@field("workload.output_len")
@field("workload.input_sigma")
@field("workload.output_sigma")
def test_synthetic_lengths_follow_the_config() -> None:
    p, o = _lengths(num_prompts=300, input_len=1000, output_len=50, input_sigma=0.3)
    assert len(p) == 300 and 850 < np.median(p) < 1150 and 40 < np.median(o) < 60
    flat, flat_o = _lengths(input_sigma=0, output_sigma=0, input_len=700, output_len=30)
    assert set(flat) == {700} and set(flat_o) == {30}
    wide, _ = _lengths(input_sigma=1.0, input_len=700)
    assert np.std(np.log(wide)) > 3 * np.std(np.log(p))


@field("workload.source")
@field("workload.range_ratio")
def test_source_and_range_ratio() -> None:
    p, _ = _lengths(source="random", input_len=400, range_ratio=0.25, num_prompts=200)
    assert p.min() >= 300 and p.max() <= 500 and len(set(p)) > 20
    fixed, _ = _lengths(source="random", input_len=400, range_ratio=0.0)
    assert set(fixed) == {400}
    cfg, _ = config(workload={"source": "sharegpt-like"})
    assert build_workload(cfg.workload).source.startswith("sharegpt-like")


@field("workload.path")
@field("workload.columns")
@field("workload.time_scale")
@field("workload.rate_scale")
def test_trace_files_columns_and_their_clock(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("when,in,out\n0,100,10\n2,200,20\n4,300,30\n")
    base = {
        "source": "trace",
        "path": str(path),
        "columns": {"timestamp": "when", "input_length": "in", "output_length": "out"},
        "arrival": "trace",
        "rate": None,
    }
    wl = build_workload(config(workload=base)[0].workload)
    assert [r.prompt_len for r in wl.requests] == [100, 200, 300]
    assert list(wl.arrivals()) == [0.0, 2.0, 4.0]  # type: ignore[arg-type]
    slow = build_workload(config(workload=base | {"time_scale": 2.0})[0].workload).arrivals()
    fast = build_workload(config(workload=base | {"rate_scale": 2.0})[0].workload).arrivals()
    assert list(slow) == [0.0, 4.0, 8.0] and list(fast) == [0.0, 1.0, 2.0]  # type: ignore[arg-type]


@field("workload.arrival")
@field("workload.rate")
@field("workload.burstiness")
@field("workload.seed")
def test_arrivals_follow_the_config() -> None:
    def gaps(**kw: Any) -> np.ndarray:
        cfg, _ = config(workload={"num_prompts": 2000} | kw)
        return np.diff(build_workload(cfg.workload).arrivals())  # type: ignore[arg-type]

    pois = gaps(arrival="poisson", rate=10)
    assert 0.09 < pois.mean() < 0.11 and 0.9 < pois.std() / pois.mean() < 1.1
    const = gaps(arrival="constant", rate=5)
    assert np.allclose(const, 0.2)
    bursty = gaps(arrival="gamma", rate=10, burstiness=0.25)
    assert bursty.std() / bursty.mean() > 1.6  # CV = 1/sqrt(burstiness)
    assert not np.array_equal(gaps(seed=1), gaps(seed=2))


@field("workload.concurrency")
def test_closed_loop_concurrency(tmp_path: Path) -> None:
    cfg, _ = config(
        mode="fixed-rate", workload={"arrival": "closed", "concurrency": 7, "rate": None}
    )
    wl = build_workload(cfg.workload)
    assert wl.closed_loop_concurrency == 7 and wl.arrivals() is None

    async def peak() -> int:
        r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
        await r.start({}, "t")
        m = await r.run_level(wl, 1.0)
        return int(m.metrics.summary["max_concurrent_requests"])

    assert asyncio.run(peak()) == 7


@field("workload.warmup")
def test_warmup_requests_run_before_each_level_and_are_not_measured(tmp_path: Path) -> None:
    for warm in (0, 5):
        cfg, text = config(
            workload={"warmup": warm, "num_prompts": 40},
            mode="fixed-rate",
            strategy={"n_trials": 1},
        )
        with Store.open(f"sqlite:///{tmp_path / f'{warm}.db'}") as store:
            create_study(cfg, text, store)
            run_study("t", store)
            lv = store.trials("t")[0].levels[0]
        # the 40-request sample (10 s) looped to the 200-request minimum
        # (docs/tuning.md#13-level-length); the warm-ups count in none of them
        assert lv.metrics["warmup_requests"] == warm and lv.completed == 200


@field("workload.peak_concurrency")
def test_peak_concurrency_sizes_the_max_num_seqs_range() -> None:
    cfg, _ = config(workload={"peak_concurrency": 90})
    wl = build_workload(cfg.workload)
    b = build_bounds(cfg, model_of(cfg), wl.profile(), 0)
    assert b.mns_high == 180


@field("workload.endpoint")
def test_endpoint_decides_the_api(tmp_path: Path) -> None:
    # the prompt form follows from it (token ids for completions, text for chat):
    # tests/test_prompt_lengths.py
    for endpoint in ("completions", "chat"):
        cfg, _ = config(worker={"kind": "sim"}, workload={"endpoint": endpoint})
        r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
        assert isinstance(r, HttpRunner) and r.endpoint == endpoint


@field("worker.env_passthrough")
def test_env_passthrough_reaches_the_worker(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("MY_PLUGIN_TOKEN", "t")
    monkeypatch.setenv("OTHER_SECRET", "s")
    cfg, _ = config(worker={"kind": "sim", "env_passthrough": ["MY_PLUGIN_*"]})
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    assert isinstance(r, HttpRunner)
    env = worker_environment(os.environ, passthrough=r.worker.env_passthrough)
    assert env["MY_PLUGIN_TOKEN"] == "t" and "OTHER_SECRET" not in env


# -- search ----------------------------------------------------------------------------------
def _bounds(**search: Any) -> Any:
    cfg, _ = config(search=search)
    return build_bounds(cfg, model_of(cfg), build_workload(cfg.workload).profile(), 100)


@field("search.max_model_len.low")
@field("search.max_model_len.high")
@field("search.max_model_len.candidates")
@field("search.max_model_len_margin")
def test_max_model_len_candidates_follow_the_search_config() -> None:
    default = _bounds().max_model_len_candidates
    wider = _bounds(max_model_len_margin=0.5).max_model_len_candidates
    assert max(wider) > max(default)
    assert _bounds(max_model_len={"candidates": [4096, 1024]}).max_model_len_candidates == (
        1024,
        4096,
    )
    cut = _bounds(max_model_len={"high": min(default)}).max_model_len_candidates
    assert cut == (min(default),)
    assert min(_bounds(max_model_len={"low": max(default)}).max_model_len_candidates) == max(
        default
    )


@field("search.gpu_memory_utilization.low")
@field("search.gpu_memory_utilization.high")
@field("search.max_num_seqs.low")
@field("search.max_num_seqs.high")
@field("search.max_num_batched_tokens.low")
@field("search.max_num_batched_tokens.high")
def test_ranges_bound_the_search() -> None:
    b = _bounds(
        gpu_memory_utilization={"low": 0.7, "high": 0.85},
        max_num_seqs={"low": 16, "high": 64},
        max_num_batched_tokens={"low": 512, "high": 4096},
    )
    assert (b.util_low, b.util_high, b.mns_low, b.mns_high) == (0.7, 0.85, 16, 64)
    lo, hi = mnbt_range(b, 2048, 16, True)
    assert (lo, hi) == (512, 4096)
    assert mnbt_engine_value(1, lo, hi) == 512 and mnbt_engine_value(10**6, lo, hi) == 4096


@field("search.gpu_memory_utilization.candidates")
@field("search.max_num_seqs.candidates")
@field("search.max_num_batched_tokens.candidates")
def test_candidates_are_for_max_model_len_only() -> None:
    for name in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens"):
        with pytest.raises(ConfigError, match=f"{name}.candidates: only max_model_len"):
            config(search={name: {"candidates": [1, 2]}})


@field("search.extra.name")
@field("search.extra.choices")
def test_extra_parameters_join_the_space(tmp_path: Path) -> None:
    cfg, text = config(
        search={"extra": [{"name": "enable_prefix_caching", "choices": [False, True]}]},
        strategy={"name": "staged", "n_trials": 3, "trials_per_stage": 1, "capacity_levels": 3},
    )
    assert _bounds(extra=[{"name": "x", "choices": [1, 2]}]).extras == (("x", (1, 2)),)
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        run_study("t", store)
        trials = store.trials("t")
    assert all(t.engine_args.get("enable_prefix_caching") is False for t in trials[1:])
    assert "--no-enable-prefix-caching" in (trials[1].launch_command or "")


# -- strategy --------------------------------------------------------------------------------
def _stages(tmp_path: Path, **strategy: Any) -> list[TrialRecord]:
    cfg, text = config(strategy={"capacity_levels": 3} | strategy)
    tmp_path.mkdir(parents=True, exist_ok=True)
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        run_study("t", store)
        return store.trials("t")


@field("strategy.name")
@field("strategy.n_trials")
def test_random_and_grid_strategies(tmp_path: Path) -> None:
    rnd = _stages(tmp_path / "r", name="random", n_trials=5)
    assert [t.stage for t in rnd] == ["baseline"] + ["random"] * 4
    grid = _stages(tmp_path / "g", name="grid", n_trials=7)
    assert [t.stage for t in grid] == ["baseline"] + ["grid"] * 6
    ea = [t.engine_args for t in grid[1:]]
    # auto_tune.sh's grid: max_model_len and memory fixed, max_num_seqs x mnbt varied
    assert len({e["max_model_len"] for e in ea}) == 1
    assert {e["gpu_memory_utilization"] for e in ea} == {0.95}
    assert len({(e["max_num_seqs"], e["max_num_batched_tokens"]) for e in ea}) == 6


@field("strategy.trials_per_stage")
@field("strategy.joint_refinement")
def test_stage_sizes(tmp_path: Path) -> None:
    """Each stage gets trials_per_stage trials (1 here), less where it needs fewer (the
    plan says why), the saved ones moved to the concurrency stages; then the joint ones."""
    cfg, text = config(
        strategy={
            "capacity_levels": 3,
            "n_trials": 12,
            "trials_per_stage": 1,
            "joint_refinement": 2,
        }
    )
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        run_study("t", store)
        trials = store.trials("t")
        study = optuna.load_study(study_name="t", storage=store.optuna_storage())
        bounds = read_header(study).bounds
        plan = stage_plan(study.get_trials(), cfg.strategy, bounds)
    assert [s.name for s in plan][:5] == [*PARAM_ORDER, "joint"]
    assert [s.budget for s in plan][2:5] == [1, 1, 2]  # trials_per_stage, joint_refinement
    expected = [s.name for s in plan for _ in range(s.budget)]
    # then the coordinate passes fill the 12 trials
    assert [t.stage for t in trials] == ["baseline", *expected] and len(trials) == 12


@field("strategy.timeout_s")
def test_timeout_s_is_a_runs_default_limit(tmp_path: Path) -> None:
    cfg, text = config(strategy={"timeout_s": 0.001, "n_trials": 5, "capacity_levels": 3})
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        create_study(cfg, text, store)
        report = run_study("t", store)
        # the limit is checked before each trial: 1 ms is spent before the first one
        assert report.stopped_by == "timeout" and report.trials_run == 0
        assert run_study("t", store, timeout=3600).stopped_by == "plan complete"


@field("strategy.capacity_levels")
@field("strategy.capacity_low")
@field("strategy.capacity_high")
@field("strategy.capacity_resolution")
def test_capacity_lattice_comes_from_the_strategy(tmp_path: Path) -> None:
    trials = _stages(
        tmp_path / "a",
        n_trials=1,
        capacity_low=0.5,
        capacity_high=4.0,
        capacity_resolution=0.1,
        capacity_levels=24,
    )
    scales = [lv.scale for lv in trials[0].levels]
    ks = [np.log(s / 0.5) / np.log(1.1) for s in scales]
    assert np.allclose(ks, np.round(ks)) and max(scales) <= 4.0
    assert scales[0] == pytest.approx(0.5 * 1.1**21)  # the top point of the lattice, first
    capped = _stages(tmp_path / "b", n_trials=1, capacity_levels=2)
    assert len(capped[0].levels) == 2


# -- telemetry -------------------------------------------------------------------------------
class _FakeWorker:
    static_args: dict[str, Any] = {}  # noqa: RUF012  (read only)
    gpus = None

    async def start(self, engine_args: Any, trial_name: str) -> WorkerInfo:
        return WorkerInfo(
            base_url="http://127.0.0.1:9999",
            argv=("vllm", "serve", "m"),
            command="vllm serve m",
            startup_s=0.0,
            pid=1,
            log_path=Path("/dev/null"),
            smoke_prompt_tokens=None,
            kv_cache_tokens=None,
            max_concurrency=None,
            num_gpu_blocks=None,
            block_size=None,
        )


@field("telemetry.prometheus_url")
@field("telemetry.sd_file")
@field("telemetry.scrape_interval_s")
async def test_prometheus_targets_and_scrape_interval(tmp_path: Path) -> None:
    sd = tmp_path / "targets.json"
    cfg, _ = config(
        worker={"kind": "sim"},
        telemetry={
            "prometheus_url": "http://127.0.0.1:9",
            "sd_file": str(sd),
            "scrape_interval_s": 0.7,
        },
    )
    r = make_runner(cfg, model_of(cfg), get_hardware(cfg.hardware), tmp_path)
    assert isinstance(r, HttpRunner) and r.prom is not None
    assert r.prom.url.startswith("http://127.0.0.1:9") and r.scrape_interval_s == 0.7
    r.worker = _FakeWorker()  # type: ignore[assignment]
    await r.start({}, "trial-0007")
    target = json.loads(sd.read_text())
    assert target[0]["targets"] == ["127.0.0.1:9999"]
    assert target[0]["labels"]["trial"] == "trial-0007"
    plain, _ = config(worker={"kind": "sim"})
    pr = make_runner(plain, model_of(plain), get_hardware(plain.hardware), tmp_path)
    assert isinstance(pr, HttpRunner) and pr.prom is None and pr.scrape_interval_s == 2.0


def test_config_with_every_field_parses() -> None:
    """The marked fields above are the ones a config can set: a config setting all of them
    (sections the tests build) is valid."""
    cfg = parse_config(config(strategy={"capacity_resolution": 0.02})[1])
    assert isinstance(cfg, StudyConfig) and cfg.strategy.capacity_resolution == 0.02
