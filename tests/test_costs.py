"""Step cost model (docs/simulator.md#3-step-cost-model): hand-computed values, shape
properties, published anchors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.profiles.hardware import get_hardware
from autotune.profiles.models import get_model
from autotune.sim.costs import DEFAULT_T_FIXED, DEFAULT_T_REQ, CostModel

LLAMA3_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA2_7B = "meta-llama/Llama-2-7b-hf"
LLAMA3_70B = "meta-llama/Llama-3.1-70B-Instruct"


def cost(model: str, gpu: str, tp: int = 1, **overrides: float) -> CostModel:
    return CostModel.build(get_model(model), get_hardware(gpu), tp, **overrides)


# -- hand-computed small case ------------------------------------------------------------
def test_hand_computed_tiny_llama_on_test_device() -> None:
    """tiny-llama (L=2, H=128, nh=4, nkv=2, hd=32, I=256, V=2000, bf16) on test-4GB
    (F=10e12, B=0.1e12, eta_bw=0.8, eta_f=0.7, eta_attn=0.55, eta_fa=0.5), TP=1.

    Batch: two decodes (ctx 100 and 50) + one 8-token chunk on a 4-token prefix that
    finishes its prompt: T=10, n_samp=3, n_scheduled=3.
    """
    c = cost("autotune/tiny-llama", "test-4GB")
    # P_layer = 128·32·(4+2·2) + 4·32·128 + 3·128·256 = 32768 + 16384 + 98304 = 147456
    # W = (2·147456 + 2000·128)·2 B = (294912 + 256000)·2 = 1_101_824 B
    t_mem_w = 1_101_824 / (0.1e12 * 0.8)  # 1.37728e-5 s
    # linear FLOPs = 2·294912·10 + 2·256000·3 = 5_898_240 + 1_536_000 = 7_434_240
    t_lin_c = 7_434_240 / (10e12 * 0.7)
    t_lin = math.sqrt(t_mem_w**2 + t_lin_c**2) * 1.10
    # KV/token = 2·L·nkv·hd·2 B = 2·2·2·32·2 = 512 B; Σctx = 150
    t_attn_d = 150 * 512 / (0.1e12 * 0.55)
    # prefill work = 8·(4 + 8/2) = 64; FLOPs = 4·L·nh·hd·64 = 4·2·4·32·64 = 65_536
    t_attn_p = 65_536 / (10e12 * 0.5)
    expected = t_lin + t_attn_d + t_attn_p + 0.7e-3 + 3 * 4.42e-6
    assert CostModel.prefill_work(8, 4) == 64.0
    got = c.step_time(10, 3, 150, CostModel.prefill_work(8, 4), 3)
    assert got == pytest.approx(expected, rel=1e-12)
    # Written out: 15.195 (linear) + 1.396 (KV read) + 0.013 (prefill attn) + 700 + 13.26 µs
    assert got == pytest.approx(729.865e-6, rel=1e-5)
    assert c.t_fixed == DEFAULT_T_FIXED and c.t_req == DEFAULT_T_REQ


def test_empty_step_costs_nothing() -> None:
    assert cost(LLAMA3_8B, "A100-80GB").step_time(0, 0, 0, 0.0, 0) == 0.0


def test_overrides_apply_and_unknown_names_fail() -> None:
    base = cost(LLAMA3_8B, "A100-80GB")
    slower = cost(LLAMA3_8B, "A100-80GB", eta_attn=0.275, t_fixed=0.2e-3)
    assert slower.attn_per_ctx == pytest.approx(2 * base.attn_per_ctx)
    assert slower.t_fixed == 0.2e-3
    with pytest.raises(TypeError, match="eta_atn"):
        cost(LLAMA3_8B, "A100-80GB", eta_atn=0.5)
    with pytest.raises(ValueError):
        cost(LLAMA3_8B, "A100-80GB", tp=0)


# -- shape of the model -------------------------------------------------------------------
@pytest.mark.parametrize(("gpu", "published"), [("A100-80GB", 145), ("H100-80GB", 270)])
def test_knee_matches_flops_over_bandwidth(gpu: str, published: int) -> None:
    """Compute time equals weight-read time at T ≈ F·η_f / (B·η_bw)
    (docs/simulator.md#32-constants-and-their-sources); the exact knee is a few % later
    because W also holds the LM head, which T=0 tokens skip."""
    hw = get_hardware(gpu)
    c = cost(LLAMA3_8B, gpu)
    ratio = hw.peak_flops * hw.eta_f / (hw.mem_bw * hw.eta_bw)
    assert ratio == pytest.approx(published, rel=0.02)
    assert c.knee_tokens == pytest.approx(ratio, rel=0.10)
    assert c.lin_per_token * c.knee_tokens == pytest.approx(c.t_mem_w)


def test_weights_amortise_over_the_batch() -> None:
    c = cost(LLAMA3_8B, "A100-80GB")
    one = c.step_time(1, 1, 0, 0.0, 1)
    assert c.step_time(64, 64, 0, 0.0, 64) < 0.2 * 64 * one
    # Below the knee the step is weight-read bound: 64 tokens cost < 15 % more than one.
    assert c.step_time(64, 1, 0, 0.0, 1) < 1.15 * one


def test_decode_time_grows_with_context() -> None:
    c = cost(LLAMA3_8B, "H100-80GB")
    times = [c.decode_step_time(32, ctx) for ctx in (0, 512, 2048, 8192)]
    assert times == sorted(times) and len(set(times)) == 4
    # Linear in Σctx: equal increments for equal context increments.
    d1 = c.decode_step_time(32, 2048) - c.decode_step_time(32, 1024)
    d2 = c.decode_step_time(32, 3072) - c.decode_step_time(32, 2048)
    assert d1 == pytest.approx(d2)


def test_prefill_attention_is_quadratic_in_chunk_length() -> None:
    c = cost(LLAMA3_8B, "A100-80GB")

    def attn(tokens: int, prefix: int = 0) -> float:
        return c.attn_per_work * CostModel.prefill_work(tokens, prefix)

    assert attn(4096) == pytest.approx(4 * attn(2048))
    # A chunk on a prefix attends to it: the second half of a prompt costs more than the first.
    assert attn(1024, 1024) == pytest.approx(3 * attn(1024))
    assert c.prefill_time(1024, 1024) > c.prefill_time(1024)


def test_tensor_parallel_speeds_up_70b() -> None:
    tp1, tp2 = cost(LLAMA3_70B, "H100-80GB"), cost(LLAMA3_70B, "H100-80GB", tp=2)
    assert tp2.decode_step_time(1, 1024) < 0.6 * tp1.decode_step_time(1, 1024)
    assert tp2.decode_step_time(64, 1024) < tp1.decode_step_time(64, 1024)
    assert tp2.prefill_time(2048) < 0.6 * tp1.prefill_time(2048)
    assert tp1.tp_per_token == 0.0 and tp2.tp_per_token > 0.0


# -- published anchors, ±15 % of the range midpoint ----------------------------------------
# docs/simulator.md#33-reference-outputs-of-the-formula, docs/simulator.md#7-published-anchors
@pytest.mark.parametrize(
    ("model", "gpu", "lo_ms", "hi_ms"),
    [
        (LLAMA3_8B, "A100-80GB", 10.0, 11.0),
        (LLAMA3_8B, "H100-80GB", 5.0, 6.5),
        (LLAMA2_7B, "A100-80GB", 10.0, 11.0),
        (LLAMA2_7B, "H100-80GB", 5.0, 6.5),
    ],
)
def test_decode_bs1_anchor(model: str, gpu: str, lo_ms: float, hi_ms: float) -> None:
    # the anchors are GPU time per step; t_fixed is the engine's CPU time per step
    # (docs/simulator.md#7-published-anchors)
    c = cost(model, gpu)
    got_ms = (c.decode_step_time(1, 1024) - c.t_fixed) * 1e3
    assert got_ms == pytest.approx((lo_ms + hi_ms) / 2, rel=0.15)


@pytest.mark.parametrize(
    ("model", "gpu", "lo", "hi"),
    [
        (LLAMA3_8B, "A100-80GB", 14e3, 14e3),
        (LLAMA3_8B, "H100-80GB", 40e3, 45e3),
        (LLAMA2_7B, "A100-80GB", 14e3, 14e3),
        (LLAMA2_7B, "H100-80GB", 40e3, 45e3),
    ],
)
def test_prefill_2048_anchor(model: str, gpu: str, lo: float, hi: float) -> None:
    tok_s = 2048 / cost(model, gpu).prefill_time(2048)
    assert tok_s == pytest.approx((lo + hi) / 2, rel=0.15)


# -- fast path: k identical decode steps --------------------------------------------------
_MODELS = st.sampled_from([LLAMA3_8B, LLAMA2_7B, LLAMA3_70B, "autotune/tiny-llama"])
_GPUS = st.sampled_from(["A100-80GB", "H100-80GB", "L4", "test-4GB"])


@given(
    model=_MODELS,
    gpu=_GPUS,
    tp=st.sampled_from([1, 2, 4]),
    k=st.integers(0, 300),
    batch=st.integers(1, 512),
    sum_ctx0=st.integers(0, 2_000_000),
)
def test_decode_run_times_equals_summed_steps(
    model: str, gpu: str, tp: int, k: int, batch: int, sum_ctx0: int
) -> None:
    c = cost(model, gpu, tp)
    summed = math.fsum(
        c.step_time(batch, batch, sum_ctx0 + i * batch, 0.0, batch) for i in range(k)
    )
    assert c.decode_run_times(k, batch, sum_ctx0) == pytest.approx(summed, rel=1e-9, abs=1e-15)
