"""The progress lines ``study run`` prints, one per event of the run."""

from __future__ import annotations

import sys

from rich.markup import escape

from autotune.cli._app import console
from autotune.report.bounds import SETTLED, capacity_of, trial_capacity
from autotune.report.levels import progress_figures, progress_note
from autotune.tuning.measure.findings import capacity_rps, why_infeasible
from autotune.tuning.run.events import (
    Event,
    LevelDone,
    LevelProgress,
    OnEvent,
    RunStart,
    TrialAbandoned,
    TrialDone,
    TrialInferred,
    TrialStart,
    TwinRound,
    ValidationRunDone,
    ValidationSettledEarly,
    ValidationStart,
    Waiting,
    WorkerDied,
    WorkerFailed,
)

__all__ = ["progress_printer"]


def _rate(rps: float | None) -> str:
    return f" ({rps:,.2f} req/s)" if rps is not None else ""


def progress_printer() -> OnEvent:
    """Progress lines. Trial numbers are Optuna's (0-based, as `study show` and `best` print
    them); "k of n" counts complete trials against the plan."""
    out = console()

    def on_event(e: Event) -> None:
        # a parallel run's lines name their trial and devices: the lanes' lines interleave
        lane = getattr(e, "lane", None)
        tag = f"trial {getattr(e, 'number', None)} on gpu {lane.devices}: " if lane else ""
        match e:
            case RunStart():
                limit = f", stops after {e.timeout_s:,.0f} s" if e.timeout_s else ""
                lanes = e.lanes
                par = f"; {len(lanes)} at a time on gpu {' | '.join(lanes)}" if lanes else ""
                out.print(f"plan: {e.planned} trials ({e.done} done{limit}{par})")
                for line in e.recovered:  # what dead runs left, and how it was fixed
                    out.print(f"recovered: {escape(line)}")
            case Waiting():  # other controllers run the rest of the stage
                out.print(f"waiting: {escape(e.reason)}")
            case TrialAbandoned():
                print(f"{e.line}", file=sys.stderr)
            case TrialStart():
                ea = e.engine_args
                pos = e.position
                of = f" ({pos[0]} of {pos[1]})" if pos else ""
                on = f" on gpu {lane.devices}" if lane else ""
                # the parallelism stage's size comes first, as it is suggested
                # (docs/tuning.md#16-the-parallelism-stage)
                tp = ea.get("tensor_parallel_size")
                tp_text = f"tensor_parallel_size={tp} " if tp is not None else ""
                out.print(
                    f"[bold]trial {e.number}{of}[/bold]{on} {escape('[' + e.stage + ']')} "
                    f"{tp_text}max_model_len={ea['max_model_len']} "
                    f"gpu_memory_utilization={ea['gpu_memory_utilization']} "
                    f"max_num_seqs={ea['max_num_seqs']} "
                    f"max_num_batched_tokens={ea['max_num_batched_tokens']}"
                )
            case LevelProgress() if out.is_terminal and not tag:  # live replay (HTTP)
                p99 = f"{e.p99_ttft_ms:,.0f} ms" if e.p99_ttft_ms is not None else "-"
                out.print(
                    f"    load x{e.scale:.3f}: sent {e.sent}/{e.planned}, completed "
                    f"{e.completed}, failed {e.failed}, p99 TTFT so far {p99}",
                    end="\r",
                )
            case LevelDone():
                m = e.metrics
                verdict = "ok" if e.feasible else escape("; ".join(e.violations) or "violates")
                verdict += progress_note(m)  # docs/tuning.md#10-early-stop-inside-a-level
                out.print(
                    f"    {tag}load x{e.scale:.3f}{_rate(e.offered_rate)}: "
                    f"{progress_figures(m)} -> {verdict}"
                )
            case TrialInferred():
                out.print(f"    {tag}{escape(e.line)}:")
            case WorkerFailed():
                out.print(f"    {tag}worker failed: {e.failure_class}: {escape(e.message)}")
            case WorkerDied():  # mid-level: the level stopped, its partial results kept
                what = "hung" if e.failure_class == "HUNG" else "died"  # a hang is no death
                out.print(
                    f"    {tag}load x{e.scale:.2f}: worker {what} ({e.failure_class}): "
                    f"{escape(e.message)}; level stopped, partial results kept"
                )
            case ValidationStart():
                out.print(
                    f"validation: re-measuring the top configs and the baseline on fresh "
                    f"workload samples ({e.pending} of {e.planned} runs to go)"
                )
                for text in e.told_apart:
                    out.print(f"  not re-measured: {escape(text)}")
            case ValidationSettledEarly():
                out.print(
                    f"validation: the verdict is settled after {e.repeats} of {e.planned} "
                    f"repeats (the early look); {e.dropped} runs not needed"
                )
                if e.passed:
                    names = ", ".join(f"trial {t}" for t in e.passed)
                    out.print(
                        f"  {names}: never measured above trial {e.chosen} on a shared "
                        f"sample, so not run to the end"
                    )
                if e.tied:
                    names = ", ".join(f"trial {t}" for t in e.tied)
                    out.print(
                        f"  {names}: beats the baseline too, by a mean gain within trial "
                        f"{e.chosen}'s interval; the runs cannot tell them apart, so not run "
                        f"to the end"
                    )
            case ValidationRunDone():
                res = e.result
                fig = (
                    f"x{res.capacity_scale:.3f}"
                    if e.mode == "slo-capacity" and res.capacity_scale is not None
                    else f"{res.objective:,.0f} tok/s"
                    if res.objective is not None
                    else "-"
                )
                verdict = "ok" if res.slo_held else escape("; ".join(res.violations) or "violates")
                out.print(
                    f"  repeat {e.repeat} trial {e.trial} {escape('[' + e.role + ']')} "
                    f"({e.done} of {e.planned}): {fig} -> {verdict}"
                )
            case TrialDone():
                rec = e.record
                settled = trial_capacity(rec, None, e.mode)
                if settled is not None and settled.status == SETTLED:
                    out.print(f"  -> {tag}settled: capacity {escape(settled.text())}")
                elif e.feasible:
                    cap = capacity_of(e.capacity_scale, capacity_rps(rec), e.capacity_status)
                    if e.capacity_scale is None:
                        at = ""
                    elif cap.exact:
                        at = f" at x{e.capacity_scale:.3f}{_rate(cap.rps)}"
                    else:  # the top of the range: a lower bound (docs/usage.md#1-commands)
                        at = f" at {cap.text()}"
                    out.print(f"  -> {tag}{e.objective:,.1f} output tok/s{escape(at)}")
                else:
                    why = why_infeasible(rec, e.mode) or "infeasible"
                    out.print(f"  -> {tag}infeasible: {escape(why)}")
            case TwinRound():  # docs/tuning.md#15-the-twin-strategy
                fit = ", ".join(f"{k} {v:.1f} %" for k, v in e.residual_pct.items())
                head = f"twin: fit error {fit or 'n/a'}"
                if e.levels_fitted < e.levels:  # the round's CPU afforded only the latest
                    head += f" ({e.levels_fitted} of {e.levels} levels)"
                head += f"; screened {e.screened} configs"
                head += f" in {e.cpu_s:.0f} s of CPU"
                if e.stop is not None:
                    out.print(escape(f"{head}; stops: {e.stop}"))
                else:
                    nxt = ", ".join(f"{k}={v}" for k, v in (e.next_args or {}).items())
                    gain = e.predicted_gain_pct
                    g = f" (predicted {gain:+.1f} % on the best measured)" if gain else ""
                    out.print(escape(f"{head}; next: {nxt}{g}"))
            case _:  # level starts, validation runs starting and done: no line
                pass

    return on_event
