"""Secrets are masked in every output: stored launch commands and configs, `study best`,
exports; and a server that requires an API key is still smoke-tested and loaded."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from autotune import cli
from autotune.redact import (
    MASK,
    is_secret_name,
    mask_argv,
    mask_command,
    mask_text,
    mask_url_passwords,
)
from autotune.store import Store
from autotune.tuning.measure.http_runner import HttpRunner
from autotune.workers import SimWorker
from autotune.workers.vllm_command import format_command, vllm_argv
from autotune.workload.sources import LogNormal, synthetic_workload

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEY = "sk-test-4f9a2c"  # the API key: must appear in no output
DB_PASSWORD = "pw-in-config-77"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("--api-key", True),
        ("hf_token", True),
        ("HF_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("db_password", True),
        ("tokenizer", False),
        ("max_num_batched_tokens", False),
        ("ssl_keyfile", False),
        ("spec_tokens", False),
        ("monkey", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_masking_functions() -> None:
    argv = ["vllm", "serve", "m", "--api-key", KEY, "k2", "--port", "1", "--hf-token=hf_x"]
    assert mask_argv(argv) == [
        "vllm", "serve", "m", "--api-key", MASK, MASK, "--port", "1", f"--hf-token={MASK}",
    ]  # fmt: skip
    assert KEY not in mask_command(" ".join(argv))
    assert format_command(argv) == mask_command(" ".join(argv))
    assert mask_url_passwords("postgresql://bob:pw@h:5432/d") == f"postgresql://bob:{MASK}@h:5432/d"
    assert mask_url_passwords("http://h:8080/a@b") == "http://h:8080/a@b"  # no password there
    log = f"non-default args: {{'api_key': ['{KEY}'], 'port': 8000, 'allow_credentials': True}}"
    assert KEY not in mask_text(log) and "'port': 8000" in mask_text(log)
    cfg = f"storage: postgresql://u:{DB_PASSWORD}@db/x\n"
    cfg += f"worker:\n  static_args: {{api_key: {KEY}}}\n"
    masked = mask_text(cfg)
    assert KEY not in masked and DB_PASSWORD not in masked
    assert yaml.safe_load(masked)["worker"]["static_args"]["api_key"] == MASK  # still YAML
    ref = "worker:\n  env: {HF_TOKEN: ${HF_TOKEN}}\n"
    assert mask_text(ref) == ref  # a ${VAR} reference is not a secret


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    return out


def test_no_secret_reaches_the_database_best_or_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.delenv("AUTOTUNE_DATABASE_URL", raising=False)
    config = tmp_path / "s.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            name: masked
            model: {{name: {MODEL}}}
            hardware: A100-80GB
            worker:
              static_args: {{api_key: "${{VLLM_API_KEY}}", enforce_eager: true}}
            workload: {{num_prompts: 40, input_len: 256, output_len: 32, rate: 1}}
            slo: {{p99_ttft_ms: 5000}}
            strategy: {{n_trials: 1, capacity_levels: 2}}
            storage: postgresql+psycopg://bob:{DB_PASSWORD}@db.example:5432/autotune
            """
        ),
        encoding="utf-8",
    )
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    _main(["study", "create", "--config", str(config), "--storage", url, "--run"], capsys)
    best = _main(["study", "best", "masked", "--storage", url], capsys)
    assert f"--api-key '{MASK}'" in best or f"--api-key {MASK}" in best
    exported = _main(["study", "export", "masked", "--storage", url], capsys)
    exported += _main(["study", "export", "masked", "--storage", url, "--format", "csv"], capsys)
    data = json.loads(exported[: exported.rindex("}") + 1])
    assert "${VLLM_API_KEY}" in data["study"]["config_yaml"]  # the reference is kept
    with Store.open(url) as store:
        trials = store.trials("masked")
    assert trials and all(MASK in (t.launch_command or "") for t in trials)
    assert all(MASK in (t.launch_argv or []) for t in trials)
    for text in (best, exported):
        assert KEY not in text and DB_PASSWORD not in text
    raw = db.read_bytes()  # every table, Optuna's user attributes included
    assert KEY.encode() not in raw and DB_PASSWORD.encode() not in raw


async def test_a_server_with_an_api_key_is_smoke_tested_loaded_and_masked(
    tmp_path: Path,
) -> None:
    worker = SimWorker(
        model=MODEL,
        hardware="H100-80GB",
        workdir=tmp_path,
        time_scale=50.0,
        sim_startup_delay=0.0,
        startup_timeout_s=30,
        static_args={"api_key": KEY},
    )
    runner = HttpRunner(
        worker,
        kind="sim",
        model_name=MODEL,
        endpoint="completions",
        vocab_size=128256,
        time_scale=50.0,
    )
    engine = {
        "max_model_len": 2048,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 2048,
    }
    info = await runner.start(engine, "trial-0")  # the smoke request sent the key
    try:
        assert KEY not in info.command and KEY not in " ".join(info.argv)
        wl = synthetic_workload(8, LogNormal(64, 0.1), LogNormal(8, 0.1), seed=0)
        out = await runner.run_level(wl.with_arrivals([0.1 * i for i in range(8)]), 1.0)
    finally:
        await runner.stop()
    assert out.metrics.completed == 8 and out.metrics.failed == 0
    argv = vllm_argv(["vllm"], MODEL, engine, static_args={"api_key": KEY}, host="h", port=1)
    assert KEY in argv  # the launched command keeps the key: only what is shown is masked
