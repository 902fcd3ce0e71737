"""Text datasets (ShareGPT, traces with a prompt column): lengths measured at ``study create``
with the model folder's tokenizer when the ``tokenizers`` extra is installed; otherwise by the
server at the first trial, which stops the study with a one-line "re-create the study" error
when its max_model_len candidates would change (docs/loadgen.md#43-text-datasets)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.services import need_service

from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.sim.tokenizer import SyntheticTokenizer
from autotune.store import Store
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.workload.text import approx_token_count, local_token_counter

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 8192,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def sharegpt(path: Path, prompts: list[str], reply: str) -> Path:
    data = [
        {"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": reply}]}
        for p in prompts
    ]
    path.write_text(json.dumps(data))
    return path


def study(name: str, model: str, data: Path, workdir: Path, **over: Any) -> tuple[Any, str]:
    d: dict[str, Any] = {
        "name": name,
        "model": {"name": model},
        "hardware": "H100-80GB",
        "worker": {"kind": "sim-virtual", "workdir": str(workdir)},
        "workload": {
            "source": "sharegpt",
            "path": str(data),
            "num_prompts": 12,
            "arrival": "poisson",
            "rate": 4,
        },
        "slo": {"p99_ttft_ms": 5000, "p99_tpot_ms": 200},
        "mode": "fixed-rate",
        # the 12-request sample as it is: these tests are about prompt lengths, and looped to
        # the default minimums (docs/tuning.md#13-level-length) a level over HTTP at
        # time_scale 10 would offer more than busy cores drive
        "strategy": {"name": "joint", "n_trials": 1, "min_level_s": 0, "min_level_requests": 0},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    text = yaml.safe_dump(d)
    return parse_config(text, "t.yaml"), text


def tokenizers_module() -> Any:
    try:
        return importlib.import_module("tokenizers")
    except ImportError:
        need_service("the tokenizers package", False, "pip install 'autotune[tokenizers]'")


def test_create_measures_text_with_the_model_folders_tokenizer(tmp_path: Path) -> None:
    tk = tokenizers_module()
    words = ["<unk>", "<s>", "hello", "world", "tokens", "measure", "prompt", "lengths"]
    tok = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(words)}, "<unk>"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    prompts = [" ".join(["measure prompt lengths"] * (i + 2)) for i in range(12)]
    data = sharegpt(tmp_path / "sg.json", prompts, "hello world " * 10)
    count = local_token_counter(folder)
    assert count is not None and count("hello world") == 3  # BOS, as vLLM counts it
    cfg, text = study("tok", str(folder), data, tmp_path / "w")
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        rec = create_study(cfg, text, store)
    want = sorted(count(p) for p in prompts)
    rule = sorted(approx_token_count(p) for p in prompts)
    assert want != rule
    assert rec.workload_profile["prompt_len"]["max"] == want[-1]


def test_first_trial_measures_and_asks_to_recreate(tmp_path: Path) -> None:
    """The simulated server counts a 6-letter vocabulary word as one token where the word
    rule counts two: the measured lengths halve, the candidates change, the study stops;
    a re-created study takes the saved lengths and runs."""
    tokenizer = SyntheticTokenizer(128256)
    prompts = [tokenizer.decode(range(100 + i, 400 + 16 * i)) for i in range(12)]
    data = sharegpt(tmp_path / "sg.json", prompts, "hello world " * 10)
    assert approx_token_count(prompts[0]) == 2 * tokenizer.count(prompts[0])
    over = {
        "worker": {"kind": "sim", "time_scale": 10.0, "workdir": str(tmp_path / "w")},
        "workload": {"num_prompts": 12, "path": str(data)},
    }
    model = "meta-llama/Llama-3.1-8B-Instruct"
    with Store.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        cfg, text = study("first", model, data, tmp_path / "w", **over)
        before = create_study(cfg, text, store).workload_profile["total_len"]["p99"]
        with pytest.raises(ConfigError) as caught:
            run_study("first", store)
        line = str(caught.value)
        assert "\n" not in line and "re-create the study" in line
        assert "max_model_len candidates" in line
        (trial,) = store.trials("first")
        assert trial.state == "FAIL"
        saved = list((tmp_path / "w" / "measured-lengths").glob("*.json"))
        assert len(saved) == 1
        lengths = json.loads(saved[0].read_text())
        assert sorted(lengths.values()) == sorted(tokenizer.count(p) for p in prompts)

        cfg2, text2 = study("second", model, data, tmp_path / "w", **over)
        after = create_study(cfg2, text2, store).workload_profile["total_len"]["p99"]
        assert after < 0.7 * before
        report = run_study("second", store)
        assert report.trials_run == 1
        (ok,) = store.trials("second")
        assert ok.state == "COMPLETE" and ok.failure_class is None, ok.log_tail
        assert ok.levels[0].metrics["prompt_len_deviation"] == 0
