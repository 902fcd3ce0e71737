"""A trial's commit in the git record (pure; docs/git-record.md): its ``vllm serve`` command
as a script, its engine args as YAML, its load levels as a table and its result as
``vllm bench serve`` writes one, under fixed names that every trial overwrites, so that the
diff between two trials' commits is the flag that changed and the figures that moved. The
message says the trial's stage, output throughput, capacity and verdict in the words of
``study show`` (capacities through :mod:`autotune.report.bounds`)."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC
from typing import Any

import yaml

from autotune.config import StudyConfig
from autotune.gitrecord.commit_spec import RecordCommit, launch_script, trial_trailers
from autotune.redact import mask_argv
from autotune.report.bounds import Capacity, trial_capacity
from autotune.report.levels import export_level, figure_cell, stop_note
from autotune.store import LevelRecord, TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.findings import why_infeasible
from autotune.workers.vllm_command import deploy_argv

__all__ = [
    "LAUNCH",
    "TRIAL_FILES",
    "levels_table",
    "result_json",
    "trial_commit",
    "trial_subject",
]

LAUNCH = "launch.sh"
_ARGS, _LEVELS, _RESULT = "engine_args.yaml", "levels.md", "result.json"
TRIAL_FILES = (LAUNCH, _ARGS, _LEVELS, _RESULT)

# `vllm bench serve`'s summary keys in the order its result JSON lists them
# (vllm/benchmarks/serve.py); then its latency statistics, matched by _LATENCY
_BENCH_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
_LATENCY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_DIGITS = 4  # figures are rounded: a diff shows a change, not float noise
_SCRIPT_NOTE = (
    "autotune's git record (docs/git-record.md): the `vllm serve` command of the trial\n"
    "named in this commit's message. Host and port are the deployment's: pass them as\n"
    "arguments (./launch.sh --port 8000)."
)


def _verdict(t: TrialRecord) -> str:
    if t.state == "PRUNED":  # settled: bounded below another trial's capacity
        return "settled"
    return "feasible" if t.feasible else "infeasible"


def _capacity(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> Capacity | None:
    return trial_capacity(t, lattice, cfg.mode)


def trial_subject(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> str:
    """``trial 7 [max_num_seqs]: 1,472 tok/s at x1.670, feasible``; a capacity at the edge
    of the range or settled is shown as its bound (``at ≥ x16.000 (top of the range)``,
    ``settled, capacity < x1.591 (settled against trial 1)``)."""
    head = f"trial {t.optuna_trial_number} [{t.stage}]"
    cap = _capacity(t, cfg, lattice)
    if t.state == "PRUNED":
        return f"{head}: settled, capacity {cap.scale_text() if cap is not None else '-'}"
    if t.feasible:
        at = f" at {cap.scale_text()}" if cap is not None and cap.scale is not None else ""
        return f"{head}: {t.objective or 0:,.0f} tok/s{at}, feasible"
    if t.failure_class and not t.levels:
        return f"{head}: infeasible, worker failed ({t.failure_class})"
    if cap is not None:  # below the lowest load tried
        return f"{head}: infeasible, capacity {cap.scale_text()}"
    return f"{head}: infeasible"


def _engine_line(t: TrialRecord) -> str:
    return " ".join(f"{k}={v}" for k, v in t.engine_args.items())


def _figures_line(lv: LevelRecord | None) -> str | None:
    if lv is None:
        return None
    return (
        f"p99 TTFT {figure_cell(lv, 'p99_ttft_ms', ',.0f')} ms, "
        f"p99 TPOT {figure_cell(lv, 'p99_tpot_ms', ',.1f')} ms, "
        f"{figure_cell(lv, 'output_throughput', ',.0f')} tok/s at x{lv.scale:.3f}"
    )


def _message(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> str:
    body = [f"engine args: {_engine_line(t)}"]
    cap = _capacity(t, cfg, lattice)
    if cap is not None:
        body.append(f"capacity: {cap.text()}")
    figures = _figures_line(t.headline_level())
    if figures is not None:
        body.append(f"{'at capacity' if t.feasible else 'closest level'}: {figures}")
    why = why_infeasible(t, cfg.mode)
    if why:
        body.append(f"why infeasible: {why}")
    body.append(f"levels measured: {len(t.levels)}")
    subject = trial_subject(t, cfg, lattice)
    return (
        f"{subject}\n\n"
        + "\n".join(body)
        + "\n\n"
        + trial_trailers(cfg.name, t.optuna_trial_number)
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def levels_table(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> str:
    """Each load level the trial measured (lowest load first, repeated points in the order
    they ran) as a Markdown table: the load, the offered and achieved rates, the peak
    concurrency, output tok/s, p99 TTFT and TPOT (a stopped level's as far as it measured
    them), the verdict and what it broke; then the trial's capacity."""
    lines = [
        f"# Load levels of trial {t.optuna_trial_number} [{t.stage}], study {cfg.name}",
        "",
        f"Engine args: {_engine_line(t)}",
        "",
        "| load | offered req/s | achieved req/s | peak concurrency | output tok/s "
        "| p99 TTFT ms | p99 TPOT ms | feasible | violations |",
        "|---:|---:|---:|---:|---:|---:|---:|:---:|---|",
    ]
    for lv in sorted(t.levels, key=lambda lv: (lv.scale, lv.level_index)):
        offered = f"{lv.offered_rate:,.2f}" if lv.offered_rate is not None else "-"
        peak = lv.metrics.get("max_concurrent_requests")
        why = "; ".join(lv.violation_texts) + stop_note(lv.metrics)
        lines.append(
            f"| x{lv.scale:.3f} | {offered} | {figure_cell(lv, 'achieved_rate', ',.2f')} "
            f"| {peak if peak is not None else '-'} "
            f"| {figure_cell(lv, 'output_throughput', ',.0f')} "
            f"| {figure_cell(lv, 'p99_ttft_ms', ',.0f')} "
            f"| {figure_cell(lv, 'p99_tpot_ms', ',.1f')} "
            f"| {'yes' if lv.feasible else 'no'} | {_cell(why.strip())} |"
        )
    if not t.levels:
        lines.append("| - | - | - | - | - | - | - | - | no level measured |")
    cap = _capacity(t, cfg, lattice)
    lines += ["", f"Verdict: {_verdict(t)}" + (f", capacity {cap.text()}" if cap else "")]
    reason = why_infeasible(t, cfg.mode)
    if reason:
        lines.append(f"Why infeasible: {reason}")
    return "\n".join(lines) + "\n"


def _tidy(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, _DIGITS) if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _tidy(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_tidy(x) for x in v]
    return v


def result_json(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> str:
    """The trial's result as ``vllm bench serve --save-result`` writes one (its setup keys
    and summary, same names and units) for the level the trial's verdict rests on (its
    capacity, else the closest it came), a stopped level's figures as far as it measured
    them; autotune's verdict under ``autotune``."""
    lv = t.headline_level()
    cap = _capacity(t, cfg, lattice)
    done = t.finished_at
    if done is not None and done.tzinfo is None:  # stored in UTC
        done = done.replace(tzinfo=UTC)
    out: dict[str, Any] = {
        # vLLM's own format for the run's date
        "date": done.astimezone(UTC).strftime("%Y%m%d-%H%M%S") if done is not None else None,
        "model_id": cfg.model.name,
    }
    extra: dict[str, Any] = {}
    if lv is not None:
        m = lv.metrics
        out["num_prompts"] = lv.completed + lv.failed
        out["request_rate"] = lv.offered_rate if lv.offered_rate is not None else "inf"
        out.update({k: m.get(k) for k in _BENCH_KEYS})
        out.update({k: v for k, v in m.items() if _LATENCY.match(k)})
        shown: dict[str, Any] = {}
        export_level(shown, lv)  # a stopped level: only what it measured
        out.update({k: v for k, v in shown.items() if k in out})
        extra = {
            "load_scale": lv.scale,
            "error_rate": lv.error_rate,
            "overlength_rate": lv.overlength_rate,
            "violations": lv.violation_texts,
            "stopped": shown.get("stopped"),
        }
    out["autotune"] = {
        "study": cfg.name,
        "trial": t.optuna_trial_number,
        "stage": t.stage,
        "verdict": _verdict(t),
        "engine_args": dict(t.engine_args),
        "output_tok_s": t.objective,
        "capacity": cap.to_dict() if cap is not None else None,
        **extra,
        "failure_class": t.failure_class,
        "why_infeasible": why_infeasible(t, cfg.mode),
    }
    return json.dumps(_tidy(out), indent=2, ensure_ascii=False) + "\n"


def trial_commit(t: TrialRecord, cfg: StudyConfig, lattice: Lattice | None) -> RecordCommit:
    """The commit of one finished trial of study ``cfg``."""
    argv = deploy_argv(
        cfg.model.name,
        t.engine_args,
        static_args=cfg.worker.static_args,
        served_model_name=cfg.model.served_name,
    )
    files = {
        LAUNCH: launch_script(mask_argv(argv), _SCRIPT_NOTE),
        _ARGS: yaml.safe_dump(dict(t.engine_args), sort_keys=False),
        _LEVELS: levels_table(t, cfg, lattice),
        _RESULT: result_json(t, cfg, lattice),
    }
    return RecordCommit(files, _message(t, cfg, lattice), frozenset({LAUNCH}))
