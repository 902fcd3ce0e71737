"""The API server's own work (autotune.sim.frontend; docs/simulator.md#34-the-api-server)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim import TwinFile, twin_hardware
from autotune.sim.args import EngineArgs
from autotune.sim.frontend import (
    DEFAULT_FRONT_END,
    NO_FRONT_END,
    FrontEnd,
    FrontEndCosts,
    front_end_of,
)
from autotune.sim.request import SimRequest
from autotune.sim.result import SimResult
from autotune.sim.virtual_loop import simulate

LLAMA = get_model("meta-llama/Llama-3.1-8B-Instruct")
H100 = get_hardware("H100-80GB")
ARGS = EngineArgs(max_model_len=4096)


def _ttfts(n: int, front_end: FrontEndCosts = DEFAULT_FRONT_END) -> np.ndarray:
    reqs = [SimRequest(500, 20, arrival=0.0, request_id=f"r{i}") for i in range(n)]
    res = simulate(LLAMA, H100, ARGS, reqs, jitter_cv=0, front_end=front_end)
    return np.array([r.ttft for r in res.requests])


def test_burst_ttft_grows_with_the_burst_and_a_single_request_barely_moves() -> None:
    means = [float(_ttfts(n).mean()) for n in (1, 8, 32, 128)]
    assert means == sorted(means) and means[-1] > 5 * means[0]
    alone, bare = _ttfts(1)[0], _ttfts(1, NO_FRONT_END)[0]
    # one request pays the API server's few milliseconds once
    fe = DEFAULT_FRONT_END
    extra = fe.per_request + 500 * fe.per_prompt_token + fe.per_step + fe.per_output_token
    assert alone - bare == pytest.approx(extra) and extra < 0.02
    # in a burst the last one waits behind every earlier one's tokenizing
    burst = _ttfts(128)
    assert burst.max() >= 128 * (fe.per_request + 500 * fe.per_prompt_token)


def test_front_end_queues_are_fifo_and_separate() -> None:
    fe = FrontEnd(FrontEndCosts(0.01, 0.0, 0.0, 0.001))
    assert [fe.admit(0.0, 10) for _ in range(3)] == pytest.approx([0.01, 0.02, 0.03])
    # outputs are not stuck behind the tokenizer's backlog
    assert fe.deliver(0.005, 2) == pytest.approx(0.007)
    # a step whose outputs outlast the next step delays that one's delivery
    assert fe.deliver(0.006, 1) == pytest.approx(0.008)
    assert fe.admit(1.0, 10) == pytest.approx(1.01)  # an idle server starts at the arrival


def test_no_front_end_changes_nothing_and_overrides_are_checked() -> None:
    fe = FrontEnd(NO_FRONT_END)
    assert fe.admit(3.0, 1000) == 3.0 and fe.deliver(4.0, 256) == 4.0
    assert DEFAULT_FRONT_END.replace(per_request=0.001).per_request == 0.001
    with pytest.raises(TypeError, match="per_request"):
        DEFAULT_FRONT_END.replace(per_requset=0.001)
    with pytest.raises(ValueError, match="per_step"):
        FrontEndCosts(0.0, 0.0, -1.0, 0.0)


def test_streaming_saturates_one_api_server() -> None:
    """Above about 1/t_output_token tokens per second the clients get tokens late."""
    reqs = [SimRequest(100, 200, arrival=0.0) for _ in range(256)]
    args = EngineArgs(max_model_len=4096, max_num_seqs=256)
    slow = FrontEndCosts(0.0, 0.0, 0.0, 200e-6)
    late = simulate(LLAMA, H100, args, reqs, jitter_cv=0, front_end=slow)
    bare = simulate(LLAMA, H100, args, reqs, jitter_cv=0, front_end=NO_FRONT_END)
    tok = sum(r.output_len for r in late.requests)
    # the engine's steps are the same; the streams end when the server has written them
    assert late.num_steps == bare.num_steps
    assert late.end >= tok * 200e-6 > bare.end


def test_an_api_server_on_the_engines_cpu_slows_the_engine_not_the_streams() -> None:
    """``engine_share``: where the API server shares the engine core's CPU, a step waits for
    that share of the last step's output work; the streams, already paced by the API server,
    end when they did, and the engine's own gaps now read the API server's pace."""
    reqs = [SimRequest(100, 200, arrival=0.0) for _ in range(64)]
    args = EngineArgs(max_model_len=4096, max_num_seqs=64)
    apart = FrontEndCosts(0.0, 0.0, 0.0, 400e-6)
    shared = apart.replace(engine_share=1.0)
    a = simulate(LLAMA, H100, args, reqs, jitter_cv=0, front_end=apart)
    s = simulate(LLAMA, H100, args, reqs, jitter_cv=0, front_end=shared)
    assert s.num_steps == a.num_steps
    assert s.end == pytest.approx(a.end, rel=0.1)  # 64 x 400 us a step either way

    def engine_gap(res: SimResult) -> float:
        return float(
            np.median(np.concatenate([np.diff(r.engine_token_times) for r in res.requests]))
        )

    # apart, the engine steps at its own pace (8 ms for 64 decodes), under the API server's
    # 25.6 ms a step; shared, at the API server's, plus the step's own CPU part
    assert engine_gap(a) < 0.5 * 64 * 400e-6
    assert engine_gap(s) == pytest.approx(64 * 400e-6, rel=0.1)
    assert FrontEndCosts(0.0, 0.0, 0.0, 0.0).engine_share == 0.0  # a GPU host: its own core
    # a calibrated profile sets it by name, as the other costs
    twin = TwinFile(autotune_twin=1, base="CPU", front_end={"engine_share": 0.5})
    assert front_end_of(twin_hardware(twin, "t")).engine_share == 0.5
