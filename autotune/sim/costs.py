"""Step cost model of the simulated engine: seconds per engine step from the batch composition.

Implements docs/simulator.md#31-formula. Per step::

    t_lin    = hypot(W / (B·η_bw), (2·L·P·T + 2·V·H·n_samp) / TP / (F·η_f)) · (1 + ε_elem)
    t_attn_d = Σctx · kv_bytes_per_token(TP) / (B·η_attn)
    t_attn_p = 4·L·nh·hd · Σ t_j·(p_j + t_j/2) / TP / (F·η_fa)
    t_tp     = 2·L·(α + 2·(TP−1)/TP · T·H·dtype / B_link)          (TP > 1 only)
    t_step   = t_lin + t_attn_d + t_attn_p + t_tp + t_fixed + t_req·n_scheduled

Why a smooth max (hypot) between the weight read and the linear-layer FLOPs: it fits Vidur's
measured linear-layer times within about ±10 % over the whole token range, where a plain
``max()`` under-predicts by 24-40 % near the knee and a sum over-predicts by up to 70 %
(docs/simulator.md#31-formula). Weights are read once per step, so batching amortises them;
KV reads make decode steps grow with Σctx; prefill attention is quadratic in the chunk length.

:meth:`CostModel.step_time` runs once per simulated engine step, so :meth:`CostModel.build`
folds every model/GPU constant into a handful of per-unit coefficients and the hot path is a
few float multiply-adds and one ``math.hypot``. Run-to-run jitter is not modelled here: the
engine applies its own seeded multiplicative factor, which keeps this module deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from autotune.profiles.hardware import HardwareProfile
from autotune.profiles.models import ModelProfile

__all__ = [
    "DEFAULT_EPS_ELEM",
    "DEFAULT_T_FIXED",
    "DEFAULT_T_REQ",
    "HW_OVERRIDES",
    "OWN_OVERRIDES",
    "CostModel",
]

# Norms, activation, RoPE and residual adds cost 8-12 % on top of the linear layers at every T
# (docs/simulator.md#32-constants-and-their-sources, derived from Vidur's profiles).
DEFAULT_EPS_ELEM = 0.10
# Per-step CPU overhead of vLLM's engine core (scheduling, preparing inputs, sampling,
# launching): fitted on the simulator-accuracy fit rows, where BLIS's beta7 = 126 µs/step left
# inter-token gaps 13-17 % short (docs/simulator.md#32-constants-and-their-sources).
DEFAULT_T_FIXED = 0.7e-3
# Per scheduled request bookkeeping: BLIS beta6 = 4.42 µs/request
# (docs/simulator.md#32-constants-and-their-sources).
DEFAULT_T_REQ = 4.42e-6

# Hardware efficiencies a caller may override by name (they live on HardwareProfile).
HW_OVERRIDES = frozenset(
    {
        "eta_bw",
        "eta_f",
        "eta_attn",
        "eta_fa",
        "interconnect_bw",
        "allreduce_latency",
        "peak_flops",
        "mem_bw",
    }
)
OWN_OVERRIDES = frozenset({"eps_elem", "t_fixed", "t_req"})


@dataclass(frozen=True, slots=True)
class CostModel:
    """Precomputed step-cost coefficients for one (model, GPU, TP) triple; all times in seconds.

    Build it with :meth:`build`; the fields are public so that benchmarks can recombine the
    terms (e.g. a plain-max baseline) without re-deriving the physics.
    """

    model_name: str
    hardware_name: str
    tp: int
    eps_elem: float
    t_fixed: float
    t_req: float
    t_mem_w: float  # reading this rank's weights once (incl. LM head): W / (B·η_bw)
    lin_per_token: float  # linear-layer FLOP time per token in the step
    lin_per_sample: float  # LM-head FLOP time per sampled token
    attn_per_ctx: float  # decode paged-attention time per context token (KV read)
    attn_per_work: float  # prefill FlashAttention time per unit of prefill_work()
    tp_per_token: float  # all-reduce bandwidth time per token (0 at TP=1)
    step_overhead: float  # t_fixed + all-reduce latency terms, paid by every step
    knee_tokens: float  # T where linear FLOP time equals the weight-read time

    @classmethod
    def build(
        cls, model: ModelProfile, hardware: HardwareProfile, tp: int = 1, **overrides: float
    ) -> CostModel:
        """Fold the model and GPU constants into per-unit coefficients.

        ``overrides`` may set ``eps_elem``, ``t_fixed``, ``t_req`` or any efficiency/peak
        field of :class:`HardwareProfile` (``eta_bw``, ``eta_f``, ``eta_attn``, ``eta_fa``,
        ``interconnect_bw``, ``allreduce_latency``, ``peak_flops``, ``mem_bw``); calibration
        (docs/simulator.md#8-calibration-and-validation, step 5) fits exactly these.
        """
        if tp < 1:
            raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
        # a calibrated profile's own constants (autotune.sim.twin), then the caller's
        own = {k: v for k, v in hardware.sim_overrides if k in OWN_OVERRIDES}
        overrides = {**own, **overrides}
        unknown = set(overrides) - HW_OVERRIDES - OWN_OVERRIDES
        if unknown:
            valid = ", ".join(sorted(HW_OVERRIDES | OWN_OVERRIDES))
            raise TypeError(f"unknown cost-model override(s) {sorted(unknown)}; valid: {valid}")
        hw_over = {k: v for k, v in overrides.items() if k in HW_OVERRIDES}
        hw = replace(hardware, **hw_over) if hw_over else hardware  # type: ignore[arg-type]
        eps = overrides.get("eps_elem", DEFAULT_EPS_ELEM)
        t_fixed = overrides.get("t_fixed", DEFAULT_T_FIXED)
        t_req = overrides.get("t_req", DEFAULT_T_REQ)

        n_layers = model.num_layers
        layer_params = float(model.params_per_layer)
        vh = float(model.vocab_size * model.hidden_size)
        dtype = model.dtype_bytes
        flops_eff = hw.peak_flops * hw.eta_f
        # Embedding lookup touches only T rows, so W counts the vocab matrix once (the LM head).
        weight_bytes = (n_layers * layer_params + vh) * dtype / tp
        t_mem_w = weight_bytes / (hw.mem_bw * hw.eta_bw)
        lin_per_token = 2.0 * n_layers * layer_params / tp / flops_eff
        # kv_bytes_per_token(tp) is already per rank (and replicates KV heads when tp > n_kv).
        attn_per_ctx = model.kv_bytes_per_token(tp) / (hw.mem_bw * hw.eta_attn)
        attn_flops = 4.0 * n_layers * model.num_heads * model.head_dim / tp
        if tp > 1:
            # Two all-reduces per layer (after attention and after the MLP), ring cost.
            tp_latency = 2.0 * n_layers * hw.allreduce_latency
            tp_per_token = (
                2.0
                * n_layers
                * 2.0
                * (tp - 1)
                / tp
                * model.hidden_size
                * dtype
                / hw.interconnect_bw
            )
        else:
            tp_latency = tp_per_token = 0.0
        return cls(
            model_name=model.name,
            hardware_name=hw.name,
            tp=tp,
            eps_elem=eps,
            t_fixed=t_fixed,
            t_req=t_req,
            t_mem_w=t_mem_w,
            lin_per_token=lin_per_token,
            lin_per_sample=2.0 * vh / tp / flops_eff,
            attn_per_ctx=attn_per_ctx,
            attn_per_work=attn_flops / (hw.peak_flops * hw.eta_fa),
            tp_per_token=tp_per_token,
            step_overhead=t_fixed + tp_latency,
            knee_tokens=t_mem_w / lin_per_token,
        )

    # -- hot path ------------------------------------------------------------------
    def step_time(
        self,
        num_tokens: int,
        num_sampled: int,
        sum_decode_ctx: int,
        prefill_attn_work: float,
        num_scheduled: int,
    ) -> float:
        """Seconds one engine step takes (docs/simulator.md#31-formula), without jitter.

        ``num_tokens``: tokens computed in the step (decodes + prefill chunk tokens);
        ``num_sampled``: requests that sample a token (decodes + chunks finishing the prompt);
        ``sum_decode_ctx``: Σ context length of the decode requests;
        ``prefill_attn_work``: Σ :meth:`prefill_work` over the step's prefill chunks;
        ``num_scheduled``: requests in the batch. An empty step costs nothing: the engine
        idles rather than launching a forward pass.
        """
        if num_tokens <= 0:
            return 0.0
        t_lin = math.hypot(
            self.t_mem_w, self.lin_per_token * num_tokens + self.lin_per_sample * num_sampled
        ) * (1.0 + self.eps_elem)
        return (
            t_lin
            + self.attn_per_ctx * sum_decode_ctx
            + self.attn_per_work * prefill_attn_work
            + self.tp_per_token * num_tokens
            + self.step_overhead
            + self.t_req * num_scheduled
        )

    @staticmethod
    def prefill_work(new_tokens: int, prefix: int) -> float:
        """Causal attention work of a chunk of ``new_tokens`` on ``prefix`` cached tokens:
        ``t·(p + t/2)`` query-key pairs (each new token attends to the prefix and, on average,
        half of the chunk), so one long chunk costs more than the same tokens split up."""
        return new_tokens * (prefix + new_tokens / 2.0)

    def decode_run_times(self, k: int, batch: int, sum_ctx0: int) -> float:
        """Total seconds of ``k`` consecutive pure-decode steps of ``batch`` requests.

        ``sum_ctx0`` is Σctx in the first step; every step adds one token to each request, so
        Σctx grows by ``batch`` per step. Only the attention term depends on Σctx, and
        linearly, so the sum is closed-form: this lets the engine jump over runs of identical
        decode steps in O(1). Equals ``sum(step_time(batch, batch, sum_ctx0 + i·batch, 0,
        batch) for i in range(k))`` up to float rounding.
        """
        if k <= 0 or batch <= 0:
            return 0.0
        per_step = (
            math.hypot(self.t_mem_w, (self.lin_per_token + self.lin_per_sample) * batch)
            * (1.0 + self.eps_elem)
            + self.tp_per_token * batch
            + self.step_overhead
            + self.t_req * batch
        )
        ctx_total = k * sum_ctx0 + batch * (k * (k - 1) // 2)
        return k * per_step + self.attn_per_ctx * ctx_total

    # -- conveniences for tests and benchmarks ---------------------------------------
    def decode_step_time(self, batch: int, ctx: int) -> float:
        """One pure-decode step of ``batch`` requests, each with context ``ctx``."""
        return self.step_time(batch, batch, batch * ctx, 0.0, batch)

    def prefill_time(self, tokens: int, prefix: int = 0) -> float:
        """One step prefilling a single ``tokens``-long chunk that completes its prompt (so it
        samples one token), on ``prefix`` already-cached tokens."""
        return self.step_time(tokens, 1, 0, self.prefill_work(tokens, prefix), 1)

    def describe(self) -> dict[str, float | int | str]:
        """The coefficients as a plain dict (for logs and ``autotune sim`` output)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
