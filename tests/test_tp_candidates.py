"""Tensor-parallel candidates (docs/sizing.md#2-tensor-parallel-candidates): vLLM's head rules
and the node's device count decide them, and the simulator refuses what the rule refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.studies import config

from autotune.errors import ConfigError, SimStartupError
from autotune.planning.candidate_study import candidate_config
from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import EngineArgs, plan_memory
from autotune.tuning.run.lanes import plan_lanes
from autotune.tuning.search.parallelism import tp_candidates
from autotune.workers.devices import devices_held
from autotune.workers.vllm_command import vllm_argv

QWEN7B = get_model("Qwen/Qwen2.5-7B-Instruct")  # 28 attention heads, 4 KV heads
L70B = get_model("meta-llama/Llama-3.1-70B-Instruct")  # 64 and 8


def test_candidates_divide_the_heads_and_the_node() -> None:
    assert (QWEN7B.num_heads, QWEN7B.num_kv_heads) == (28, 4)
    assert tp_candidates(QWEN7B, 8) == [1, 2, 4]  # 8 does not divide 28 heads
    assert tp_candidates(L70B, 8) == [1, 2, 4, 8]
    assert tp_candidates(L70B, 6) == [1, 2]  # 3 and 6 do not divide 64; 4 does not divide 6
    assert tp_candidates(QWEN7B, 1) == [1]
    with pytest.raises(ConfigError, match="devices per node"):
        tp_candidates(QWEN7B, 0)


def test_kv_heads_and_ranks_must_divide_one_another() -> None:
    # 24 attention heads divide by 6, but 6 ranks cannot share 4 KV heads (nor replicate them)
    m = replace(QWEN7B, num_heads=24, num_kv_heads=4)
    assert m.tp_error(6) is not None and "key/value heads (4)" in (m.tp_error(6) or "")
    assert "attention heads (24)" in (m.tp_error(5) or "")
    assert m.tp_error(4) is None and m.tp_error(2) is None
    assert m.tp_error(12) is None  # each KV head replicated on three ranks
    # a 12-device node: 3 and 6 ranks cannot hold 4 KV heads evenly
    assert tp_candidates(m, 12) == [1, 2, 4, 12]


def test_the_simulator_refuses_what_the_rule_refuses() -> None:
    m = replace(QWEN7B, num_heads=24, num_kv_heads=4)
    hw = get_hardware("H100-80GB")
    with pytest.raises(SimStartupError, match="key/value heads"):
        plan_memory(m, hw, EngineArgs(tensor_parallel_size=6).resolve(m, hw))
    plan_memory(m, hw, EngineArgs(tensor_parallel_size=4).resolve(m, hw))  # starts


def test_a_size_candidate_on_the_real_worker_passes_its_tp_to_vllm_and_its_devices() -> None:
    # `autotune size --worker vllm`: the candidate's study is the user's config with the TP
    # size as a static arg, which reaches `vllm serve` and sizes each trial's devices
    base, _ = config(worker={"kind": "vllm"})
    cfg = candidate_config(base, "H100-80GB", 2, 6, worker="vllm")
    assert cfg.worker.kind == "vllm" and cfg.hardware == "H100-80GB"
    assert cfg.strategy.n_trials == 6 and not cfg.strategy.validate_.enabled
    argv = vllm_argv(
        ["vllm"], cfg.model.name, {"max_num_seqs": 8}, static_args=cfg.worker.static_args
    )
    i = argv.index("--tensor-parallel-size")
    assert argv[i + 1] == "2"
    assert plan_lanes("0,1,2,3", None, cfg).lanes == (("0", "1"), ("2", "3"))
    assert devices_held(cfg.worker.static_args) == 2
