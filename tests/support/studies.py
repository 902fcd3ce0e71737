"""A small sim-virtual study config and ``config(**over)``, which merges one level of
overrides into it and returns the parsed config with its YAML text."""

from __future__ import annotations

import json
from typing import Any

import yaml

from autotune.config import parse_config

__all__ = ["BASE", "config"]

BASE: dict[str, Any] = {
    "name": "t",
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "hardware": "A100-80GB",
    "worker": {"kind": "sim-virtual"},
    "workload": {
        "source": "synthetic",
        "num_prompts": 120,
        "input_len": 512,
        "output_len": 128,
        "arrival": "poisson",
        "rate": 4,
        "seed": 0,
    },
    "slo": {"p99_ttft_ms": 3000, "p99_tpot_ms": 45},
    "mode": "slo-capacity",
    "strategy": {
        "name": "staged",
        "trials_per_stage": 2,
        "joint_refinement": 1,
        "n_trials": 12,
        "capacity_levels": 4,
    },
}


def config(**over: Any) -> tuple[Any, str]:
    d = json.loads(json.dumps(BASE))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    text = yaml.safe_dump(d)
    return parse_config(text, "test.yaml"), text
