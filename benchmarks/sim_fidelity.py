"""Fidelity of the simulated step cost model against published anchors
(docs/simulator.md#33-reference-outputs-of-the-formula, docs/simulator.md#7-published-anchors).

Usage (from the repo root)::

    python benchmarks/sim_fidelity.py [--quick]

Prints, for Llama-3-8B-class models on A100-80GB / H100-80GB, the single-request decode step
time (ctx 1024) and the prefill throughput of one 2048-token prompt against the published
ranges, with the error vs the range midpoint and PASS/FAIL at ±15 %; the same for Vidur's
per-layer kernel anchors; two naive baselines (plain-max roofline, BLIS roofline mode) so the
effect of the smooth max is visible; then regression-only numbers for the other GPUs and for
batch 64/256, which are derived, not measured. ``--quick`` only shortens the hot-path timing
loop. The last line of output is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.profiles.hardware import HardwareProfile, get_hardware
from autotune.profiles.models import ModelProfile, get_model
from autotune.sim.costs import CostModel

TOL = 0.15
CTX, PROMPT = 1024, 2048
MODELS = {"L3.1-8B": "meta-llama/Llama-3.1-8B-Instruct", "L2-7B": "meta-llama/Llama-2-7b-hf"}
OTHER_GPUS = ("A100-40GB", "H200", "L40S", "A10G", "L4")
# BLIS roofline-mode MFU (prefill, decode) from its hardware_config.json
# (docs/simulator.md#32-constants-and-their-sources).
BLIS_MFU = {"A100-80GB": (0.38, 0.18), "H100-80GB": (0.45, 0.30), "L40S": (0.32, 0.08)}

# End-to-end anchors: the summary of docs/simulator.md#7-published-anchors, applied to
# Llama-3-8B-class models.
# (kind, gpu, lo, hi, source). Both prefill anchors and the A100 decode anchor are [derived]
# from Vidur's measured per-operator profiles, not end-to-end measurements.
ANCHORS: tuple[tuple[str, str, float, float, str], ...] = (
    (
        "decode_ms",
        "A100-80GB",
        10.0,
        11.0,
        "Vidur A100 Llama-3-8B 32x0.303 ms/layer + LM head ~10.4 ms [derived]",
    ),
    (
        "decode_ms",
        "H100-80GB",
        5.0,
        6.5,
        "vLLM V1 blog ~5 ms; SGLang #1268 ITL 4.99 ms; Vidur H100 L2-7B 5.6 ms",
    ),
    (
        "prefill_tok_s",
        "A100-80GB",
        14e3,
        14e3,
        "Vidur A100 L3-8B 32x4.43 ms = 142 ms/2048 tok, excl. attn [derived]",
    ),
    (
        "prefill_tok_s",
        "H100-80GB",
        40e3,
        45e3,
        "Vidur H100 linear 752 TFLOP/s (76 % of peak) [derived]",
    ),
)
# Vidur mlp.csv per-layer medians, TP1 (docs/simulator.md#7-published-anchors): (model, gpu,
# T=1 all-ops ms/layer, T=4096 linear TFLOP/s). Attention is not in these numbers.
VIDUR_LAYER = (
    ("L3.1-8B", "A100-80GB", 0.303, 229e12),
    ("L2-7B", "A100-80GB", 0.290, 221e12),
    ("L2-7B", "H100-80GB", 0.175, 752e12),
)
# docs/simulator.md#33-reference-outputs-of-the-formula: model output of the reference formula,
# not measurements (regression only).
REF_SECTION_3_3 = {("L3.1-8B", "A100-80GB"): (18.7, 49.6), ("L3.1-8B", "H100-80GB"): (10.8, 25.7)}


def err_pct(value: float, lo: float, hi: float) -> float:
    mid = (lo + hi) / 2
    return 100.0 * (value - mid) / mid


def measures(c: CostModel) -> dict[str, float]:
    # the anchors are GPU time per step; t_fixed is vLLM's CPU time per step, fitted on
    # measured inter-token gaps (docs/simulator.md#7-published-anchors)
    return {
        "decode_ms": (c.decode_step_time(1, CTX) - c.t_fixed) * 1e3,
        "prefill_tok_s": PROMPT / c.prefill_time(PROMPT),
    }


def plain_max_step(c: CostModel, tokens: int, sampled: int, sum_ctx: int, work: float) -> float:
    """Naive per-operator roofline: max(weight read, FLOPs) per linear layer, no elementwise,
    no CPU overheads; attention terms as in the real model."""
    t_lin = max(c.t_mem_w, c.lin_per_token * tokens + c.lin_per_sample * sampled)
    return t_lin + c.attn_per_ctx * sum_ctx + c.attn_per_work * work


def blis_roofline(
    m: ModelProfile,
    hw: HardwareProfile,
    tokens: int,
    sum_ctx: int,
    work: float,
    sampled: int,
    prefill: bool,
) -> float:
    """BLIS roofline mode: max(Σ FLOPs / (F·MFU), (weights + KV bytes) / peak BW)."""
    mfu = BLIS_MFU[hw.name][0 if prefill else 1]
    flops = (
        2 * m.num_layers * m.params_per_layer * tokens
        + 2 * m.vocab_size * m.hidden_size * sampled
        + 4 * m.num_layers * m.num_heads * m.head_dim * work
    )
    weights = (m.num_layers * m.params_per_layer + m.vocab_size * m.hidden_size) * m.dtype_bytes
    kv_bytes = sum_ctx * m.kv_bytes_per_token()
    return max(flops / (hw.peak_flops * mfu), (weights + kv_bytes) / hw.mem_bw)


def baseline_measures(
    m: ModelProfile, hw: HardwareProfile, c: CostModel
) -> dict[str, dict[str, float]]:
    w = CostModel.prefill_work(PROMPT, 0)
    out = {
        "max": {
            "decode_ms": plain_max_step(c, 1, 1, CTX, 0.0) * 1e3,
            "prefill_tok_s": PROMPT / plain_max_step(c, PROMPT, 1, 0, w),
        }
    }
    if hw.name in BLIS_MFU:
        out["blis"] = {
            "decode_ms": blis_roofline(m, hw, 1, CTX, 0.0, 1, False) * 1e3,
            "prefill_tok_s": PROMPT / blis_roofline(m, hw, PROMPT, 0, w, 1, True),
        }
    return out


def kv_fits(m: ModelProfile, hw: HardwareProfile, batch: int) -> bool:
    """Rough check (0.9 utilisation minus weights) so impossible batches are flagged."""
    return batch * CTX * m.kv_bytes_per_token() <= 0.9 * hw.memory_bytes - m.weight_bytes()


def fmt(kind: str, v: float) -> str:
    return f"{v:9.2f}" if kind == "decode_ms" else f"{v:9,.0f}"


def time_hot_path(c: CostModel, n: int) -> tuple[float, float]:
    step = c.step_time
    t0 = time.perf_counter()
    for i in range(n):
        step(256, 250, 250_000 + i, 1.5e6, 256)
    t1 = time.perf_counter()
    run = c.decode_run_times
    for i in range(n):
        run(100, 256, 250_000 + i)
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short hot-path timing loop")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"bench": "sim_fidelity", "quick": args.quick, "tolerance_pct": 15}

    print(
        "== End-to-end anchors (docs/simulator.md#7-published-anchors), "
        "±15 % of the range midpoint =="
    )
    print(
        f"{'model':8} {'gpu':10} {'metric':14} {'sim':>9} {'published':>13} {'err%':>7} "
        f"{'ok':4} {'max()':>9} {'err%':>7} {'BLIS':>9} {'err%':>7}  source"
    )
    errs: list[float] = []
    base_errs: dict[str, list[float]] = {"max": [], "blis": []}
    for short, name in MODELS.items():
        m = get_model(name)
        for kind, gpu, lo, hi, src in ANCHORS:
            hw = get_hardware(gpu)
            c = CostModel.build(m, hw)
            val = measures(c)[kind]
            e = err_pct(val, lo, hi)
            errs.append(e)
            base = baseline_measures(m, hw, c)
            cells = []
            for b in ("max", "blis"):
                be = err_pct(base[b][kind], lo, hi)
                base_errs[b].append(be)
                cells.append(f"{fmt(kind, base[b][kind])} {be:+7.1f}")
            pub = f"{lo:g}-{hi:g}" if lo != hi else f"~{lo:g}"
            print(
                f"{short:8} {gpu:10} {kind:14} {fmt(kind, val)} {pub:>13} {e:+7.1f} "
                f"{'PASS' if abs(e) <= 100 * TOL else 'FAIL':4} {' '.join(cells)}  {src}"
            )
            key = f"{'' if short == 'L3.1-8B' else 'llama2_7b_'}{gpu[:4].lower()}_{kind}"
            result[key] = round(val, 3)
    result["max_abs_err_pct"] = round(max(abs(e) for e in errs), 2)
    for b, es in base_errs.items():
        result[f"baseline_{b}_max_abs_err_pct"] = round(max(abs(e) for e in es), 2)

    print("\n== Vidur per-layer kernel anchors (mlp.csv medians, TP1, no attention) ==")
    print(
        f"{'model':8} {'gpu':10} {'T=1 ms/layer':>13} {'Vidur':>7} {'err%':>7} "
        f"{'T=4096 TF/s':>12} {'Vidur':>7} {'err%':>7}"
    )
    vidur_errs: list[float] = []
    for short, gpu, ms_ref, tf_ref in VIDUR_LAYER:
        m, hw = get_model(MODELS[short]), get_hardware(gpu)
        c = CostModel.build(m, hw)
        p = m.params_per_layer
        mem = p * m.dtype_bytes / (hw.mem_bw * hw.eta_bw)
        comp = 2 * p / (hw.peak_flops * hw.eta_f)
        layer_ms = math.hypot(mem, comp) * (1 + c.eps_elem) * 1e3
        tf = 2 * p * 4096 / math.hypot(mem, comp * 4096)  # linear only: no ε (as in Vidur)
        e1, e2 = err_pct(layer_ms, ms_ref, ms_ref), err_pct(tf, tf_ref, tf_ref)
        vidur_errs += [e1, e2]
        print(
            f"{short:8} {gpu:10} {layer_ms:13.3f} {ms_ref:7.3f} {e1:+7.1f} "
            f"{tf / 1e12:12.0f} {tf_ref / 1e12:7.0f} {e2:+7.1f}"
        )
    result["vidur_layer_max_abs_err_pct"] = round(max(abs(e) for e in vidur_errs), 2)
    result["all_within_15pct"] = all(abs(e) <= 100 * TOL for e in errs + vidur_errs)

    print("\n== What the smooth max buys: Llama-3.1-8B A100 linear time (ms) around the knee ==")
    c = CostModel.build(get_model(MODELS["L3.1-8B"]), get_hardware("A100-80GB"))
    print(
        f"knee T = {c.knee_tokens:.0f} tokens;  Vidur: plain max() under-predicts 24-40 % "
        "near the knee, sum over-predicts up to 70 % (docs/simulator.md#31-formula)"
    )
    print(f"{'T':>6} {'hypot':>8} {'max':>8} {'sum':>8} {'max vs hypot':>13}")
    for t in (1, 32, 64, 128, round(c.knee_tokens), 256, 512, 2048):
        comp = c.lin_per_token * t + c.lin_per_sample * t
        h, mx, sm = math.hypot(c.t_mem_w, comp), max(c.t_mem_w, comp), c.t_mem_w + comp
        print(f"{t:6d} {h * 1e3:8.2f} {mx * 1e3:8.2f} {sm * 1e3:8.2f} {100 * (mx / h - 1):+12.1f}%")

    print(
        "\n== Regression only: uncertain: derived, not measured (ctx 1024; * = KV would not "
        "fit at 0.9 util) =="
    )
    print(
        f"{'model':8} {'gpu':10} {'W floor ms':>10} {'bs1 ms':>8} {'bs64 ms':>9} "
        f"{'bs256 ms':>9} {'prefill tok/s':>14}  note"
    )
    regress: dict[str, dict[str, float]] = {}
    for short, name in MODELS.items():
        m = get_model(name)
        for gpu in ("A100-80GB", "H100-80GB", *OTHER_GPUS):
            hw = get_hardware(gpu)
            c = CostModel.build(m, hw)
            d = {f"bs{b}_ms": round(c.decode_step_time(b, CTX) * 1e3, 3) for b in (1, 64, 256)}
            d["prefill_tok_s"] = round(PROMPT / c.prefill_time(PROMPT))
            d["weight_floor_ms"] = round(c.t_mem_w * 1e3, 3)
            regress[f"{short}/{gpu}"] = d
            flag = {b: "" if kv_fits(m, hw, b) else "*" for b in (1, 64, 256)}
            ref = REF_SECTION_3_3.get((short, gpu))
            note = f"reference formula bs64/bs256: {ref[0]}/{ref[1]} ms" if ref else ""
            print(
                f"{short:8} {gpu:10} {d['weight_floor_ms']:10.2f} "
                f"{d['bs1_ms']:7.2f}{flag[1]:1} {d['bs64_ms']:8.2f}{flag[64]:1} "
                f"{d['bs256_ms']:8.2f}{flag[256]:1} {d['prefill_tok_s']:14,d}  {note}"
            )
    result["regression_uncertain"] = regress

    n = 50_000 if args.quick else 1_000_000
    hot = CostModel.build(get_model(MODELS["L3.1-8B"]), get_hardware("H100-80GB"))
    ns_step, ns_run = time_hot_path(hot, n)
    print(
        f"\nhot path: step_time {ns_step:.0f} ns/call, decode_run_times {ns_run:.0f} ns/call "
        f"({n:,} calls each)"
    )
    result["step_time_ns_per_call"] = round(ns_step, 1)
    result["decode_run_times_ns_per_call"] = round(ns_run, 1)
    print(json.dumps(result, separators=(",", ":")))
    return 0 if result["all_within_15pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
