"""vLLM 0.32's shipped flag list: its content, value checks, version detection, the
create-time check of worker flags, and `autotune sim serve` rejecting what vLLM rejects."""

from __future__ import annotations

import json
import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune import preflight
from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.profiles.flags import (
    SIM_ONLY_FLAGS,
    check_value,
    flag_table,
    same_release,
    strip_sim_flags,
    vllm_version_of,
)
from autotune.sim.command_line import build_parser, normalize_argv

ROOT = Path(__file__).parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BASE = textwrap.dedent(
    """\
    name: t
    model: {name: meta-llama/Llama-3.1-8B-Instruct}
    hardware: A100-80GB
    workload: {num_prompts: 20, rate: 2}
    slo: {p99_ttft_ms: 3000}
    """
)


def test_the_list_ships_in_the_package_and_covers_vllm_032() -> None:
    data = json.loads(
        resources.files("autotune.profiles").joinpath("vllm_flags.json").read_text("utf-8")
    )
    assert data["vllm_version"].startswith("0.32")
    assert len(data["flags"]) >= 300  # vLLM 0.32 has about 320 serve flags
    table = flag_table()
    for flag in ("--max-model-len", "--enforce-eager", "--api-key", "--no-enforce-eager"):
        assert table.lookup(flag) is not None, flag
    assert table.lookup("disable_log_requests") is None  # removed before 0.32
    assert table.lookup("swap_space") is None
    assert table.lookup("-tp") is None  # short aliases are not static_args spellings
    assert table.lookup("tensor_parallel_size") is table.lookup("tensor-parallel-size")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"autotune.profiles" = ["vllm_flags.json"]' in pyproject


@pytest.mark.parametrize(
    ("flag", "value", "problem"),
    [
        ("block_size", 16, None),
        ("block_size", "abc", "is not an integer"),
        ("block_size", 16.5, "is not an integer"),
        ("max_model_len", "32k", None),
        ("max_model_len", "32K", None),
        ("max_model_len", "auto", None),
        ("max_model_len", "1.5K", "is not an integer"),
        ("gpu_memory_utilization", "0.9", None),
        ("gpu_memory_utilization", "most", "is not a number"),
        ("kv_cache_memory_bytes", "None", None),
        ("dtype", "bfloat16", None),
        ("dtype", "int7", "is not one of"),
        ("enforce_eager", True, None),
        ("enforce_eager", False, None),
        ("enforce_eager", "yes", "is a switch"),
        ("disable_log_stats", True, None),
        ("disable_log_stats", False, "without a --no- form"),
        ("api_key", ["a", "b"], None),
        ("api_key", [], "at least one value"),
        ("tensor_parallel_size", [1, 2], "takes one value"),
        ("compilation_config", {"mode": 3}, None),
        ("compilation_config", '{"mode": 3}', None),
        ("compilation_config", "[1]", "is not a JSON object"),
        ("block_size", {"a": 1}, "not a mapping"),
        ("hf_token", True, None),  # nargs "?": the bare flag
        ("port", True, "takes a value"),
        ("moe_backend", "FLASHINFER-CUTLASS", None),  # vLLM lower-cases and snakes it
        ("kv_cache_dtype", None, None),  # left out of the command line
    ],
)
def test_values_are_checked_as_vllm_parses_them(flag: str, value: Any, problem: str | None) -> None:
    spec = flag_table().lookup(flag)
    assert spec is not None
    got = check_value(spec, value)
    if problem is None:
        assert got is None, got
    else:
        assert got is not None and problem in got, got


def _fake_venv(root: Path, version: str) -> Path:
    """A venv layout: bin/python, bin/vllm with a #! line, and vLLM's dist-info."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    exe = root / "bin" / "vllm"
    exe.write_text(f"#!{python}\nimport sys\n")
    exe.chmod(0o755)
    info = root / "lib" / "python3.12" / "site-packages" / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return exe


def test_the_workers_vllm_version_is_read_from_its_install(tmp_path: Path) -> None:
    exe = _fake_venv(tmp_path / "v40", "0.40.1")
    assert vllm_version_of([str(exe)]) == "0.40.1"
    assert vllm_version_of([str(tmp_path / "missing")]) is None
    assert same_release("0.32.0+cpu", "0.32.0") and same_release("0.32.1", "0.32.0")
    assert not same_release("0.33.0", "0.32.0")


def _check(text: str) -> list[str]:
    return preflight.check(parse_config(text, "s.yaml"), text, "s.yaml")


def test_another_vllm_release_turns_flag_errors_into_warnings(tmp_path: Path) -> None:
    exe = _fake_venv(tmp_path / "v40", "0.40.1")
    text = BASE + f"worker:\n  kind: vllm\n  vllm_executable: [{exe}]\n"
    text += "  static_args: {brand_new_flag: 1}\n"
    warnings = _check(text)
    assert "runs vLLM 0.40.1" in warnings[0]
    assert "worker.static_args.brand_new_flag: not a flag of vllm serve 0.32.0" in warnings[1]
    same = _fake_venv(tmp_path / "v32", "0.32.0+cpu")
    with pytest.raises(ConfigError, match="brand_new_flag: not a flag"):
        _check(text.replace(str(exe), str(same)))
    # flags autotune sets stay errors whatever the version
    with pytest.raises(ConfigError, match="--port is set by autotune"):
        _check(text.replace("brand_new_flag", "port"))


def test_a_worker_that_cannot_be_found_gets_warnings(tmp_path: Path) -> None:
    text = BASE + f"worker:\n  kind: vllm\n  vllm_executable: [{tmp_path}/none]\n"
    text += "  static_args: {block_size: abc}\n"
    warnings = _check(text)
    assert "cannot tell which vLLM" in warnings[0] and "--block-size" in warnings[1]


def test_good_static_args_pass_and_env_references_are_not_literal_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    text = BASE + textwrap.dedent(
        """\
        worker:
          kind: sim
          static_args:
            enforce_eager: true
            dtype: bfloat16
            api_key: ${MY_KEY}
            compilation_config.mode: 3
            sim_request_log: /tmp/x.jsonl
          env: {HF_TOKEN: "${MY_KEY}"}
        search:
          extra:
            - {name: enable_prefix_caching, choices: [true, false]}
        """
    )
    assert _check(text) == []


def test_the_shipped_configs_pass_the_flag_check() -> None:
    from autotune.nightly.job import study_config_for
    from autotune.nightly.job_config import parse_nightly_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if "deployment" in (yaml.safe_load(text) or {}):  # a nightly job's config
            nightly = parse_nightly_config(text, str(path))
            study = study_config_for(nightly, "flags", {"source": "synthetic", "rate": 1.0})
            assert preflight.flag_problems(study) == [], path
            continue
        cfg = parse_config(text, str(path))
        assert preflight.flag_problems(cfg) == [], path


# -- autotune sim serve: the simulator's parser is vLLM's ----------------------------------


def _parse(*args: str) -> Any:
    return build_parser().parse_args(normalize_argv([MODEL, "--hardware", "H100-80GB", *args]))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--disable-log-requests"], "unrecognized arguments: --disable-log-requests"),
        (["--swap-space", "4"], "unrecognized arguments: --swap-space 4"),
        (["--block-size", "abc"], "argument --block-size: 'abc' is not an integer"),
        (["--dtype", "int7"], "argument --dtype: invalid choice: 'int7'"),
        (["--max-model-len", "1.5K"], "argument --max-model-len"),
        (["--enable-chunked-prefill", "yes"], "unrecognized arguments: yes"),
        (["--max-num-seqz", "4"], "unrecognized arguments: --max-num-seqz"),
    ],
)
def test_sim_serve_rejects_what_vllm_rejects(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        _parse(*args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_sim_serve_has_exactly_the_registered_simulator_flags() -> None:
    """The parser's own flags (neither vLLM's, modeled or ignored, nor the model) are the
    registry's: one list for the parser, the pre-launch checks and printed commands."""
    vllm = {s.dest for s in flag_table().by_option.values()}
    own = {k for k in vars(_parse()) if k not in vllm and not k.startswith("ignored_")}
    assert own - {"model"} == SIM_ONLY_FLAGS
    args = {"sim_jitter_cv": 0.1, "time_scale": 2.0, "max_num_seqs": 8, "dtype": "half"}
    assert strip_sim_flags(args) == {"max_num_seqs": 8, "dtype": "half"}


def test_sim_serve_accepts_vllm_flags_it_does_not_model() -> None:
    ns = _parse(
        "--max_model_len",  # FlexibleArgumentParser: underscores are dashes
        "4k",
        "--no-enforce-eager",
        "--kv-cache-dtype",
        "fp8",
        "--compilation-config.mode",
        "3",
        "--api-key",
        "a",
        "b",
        "--hf-token",
        "-tp",
        "1",
        "--trust-remote-code",
    )
    assert ns.max_model_len == 4000 and ns.enforce_eager is False
    assert ns.ignored_kv_cache_dtype == "fp8" and ns.api_key == ["a", "b"]
    assert ns.ignored_hf_token is True and ns.tensor_parallel_size == 1
    assert _parse("--max-model-len", "32K").max_model_len == 32 * 1024
    assert _parse("--max-model-len", "auto").max_model_len is None
