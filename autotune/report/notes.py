"""Markdown: a trial's note and a study's note for optuna-dashboard, and the Markdown
summary of ``autotune report --md`` for pull requests and chat (pure).

Numbers are formatted once here, as the terminal prints them (docs/report.md#4-notes).
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.report.best_output import format_validation, study_hints, validation_block
from autotune.report.bounds import capacity_cell, state_word, trial_capacity
from autotune.report.levels import figure_cell, stop_note
from autotune.report.recommend import gain_text
from autotune.report.study_view import (
    ENGINE_KEYS,
    StudyView,
    baseline_comparison,
    details,
    stage_history,
)
from autotune.store import TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.findings import capacity_rps, why_infeasible
from autotune.tuning.measure.level_plan import lattice_of

__all__ = ["markdown_report", "study_note", "trial_note"]


def _cell(text: object) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in head) + " |"]
    lines.append("|" + "|".join("---" for _ in head) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(v: float | None, fmt: str = ",.1f") -> str:
    return "-" if v is None else format(v, fmt)


def _engine_line(t: TrialRecord) -> str:
    keys = [
        *[k for k in ENGINE_KEYS if k in t.engine_args],
        *sorted(set(t.engine_args) - set(ENGINE_KEYS)),
    ]
    return " · ".join(f"`{k}` {t.engine_args[k]}" for k in keys)


def _headline(t: TrialRecord, mode: str, lattice: Lattice | None = None) -> str:
    settled = trial_capacity(t, lattice, mode) if t.state == "PRUNED" else None
    if settled is not None:  # docs/tuning.md#14-settling-losing-trials
        return f"**settled**: capacity {settled.text()}"
    if t.state != "COMPLETE":
        return f"**{state_word(t.state)}**"
    if not t.feasible:
        return f"**infeasible**: {why_infeasible(t, mode) or 'violates the SLOs'}"
    lv = t.headline_level()
    rps = capacity_rps(t)
    cap = trial_capacity(t, lattice, mode)
    at = ""
    if cap is not None and not cap.exact:  # the top of the range: a lower bound
        at = f" at capacity {cap.text()}"
    elif t.capacity_scale is not None:
        at = f" at capacity x{t.capacity_scale:.3f}" + (f" ({rps:,.2f} req/s)" if rps else "")
    lat = ""
    if lv is not None:
        lat = f" · p99 TTFT {_num(lv.p99_ttft_ms)} ms · p99 TPOT {_num(lv.p99_tpot_ms)} ms"
    return f"**{t.objective or 0:,.1f} output tok/s**{at}{lat}"


def trial_note(
    t: TrialRecord,
    mode: str,
    constraint_names: Sequence[str] = (),
    lattice: Lattice | None = None,
) -> str:
    """A trial's levels table, violations, diagnosis and launch command (``lattice``: the
    study's, for its capacity's bound)."""
    out = [
        f"## Trial {t.optuna_trial_number} · {t.stage}",
        "",
        _headline(t, mode, lattice),
        "",
        _engine_line(t),
        "",
    ]
    if t.levels:
        rows = [
            (
                f"x{lv.scale:.3f}",
                _num(lv.offered_rate, ",.2f"),
                lv.completed,
                lv.failed,
                figure_cell(lv, "p99_ttft_ms"),
                figure_cell(lv, "p99_tpot_ms"),
                figure_cell(lv, "output_throughput"),
                "ok"
                if lv.feasible
                else ("; ".join(lv.violation_texts) or "violates") + stop_note(lv.metrics),
            )
            for lv in sorted(t.levels, key=lambda lv: lv.scale)
        ]
        head = (
            "load",
            "offered req/s",
            "completed",
            "failed",
            "p99 TTFT ms",
            "p99 TPOT ms",
            "output tok/s",
            "result",
        )
        out += [f"### Load levels ({len(t.levels)}, by load)", "", _table(head, rows), ""]
    elif t.failure_class:
        out += [f"The worker failed before any load level: `{t.failure_class}`.", ""]
    if t.constraints and constraint_names and len(constraint_names) == len(t.constraints):
        parts = [f"`{n}` {v:+.3f}" for n, v in zip(constraint_names, t.constraints, strict=True)]
        why = "Optuna's margins; > 0 is violated"
        if t.feasible is False and t.levels:  # docs/tuning.md#10-early-stop-inside-a-level
            why += (
                "; a broken SLO whose verdict point is known reads the share of its level"
                " still to be sent then"
            )
        out += [f"**Constraints** ({why}): " + ", ".join(parts), ""]
    if t.diagnosis:
        d = t.diagnosis
        out += [f"**Bottleneck**: {d.get('kind')}. {d.get('suggestion') or ''}".rstrip(), ""]
    if t.launch_command:
        out += ["**Launch command**", "", "```", t.launch_command, "```", ""]
    if t.inferred_from is not None:  # docs/tuning.md#14-settling-losing-trials
        out += [
            f"**Inferred** from trial {t.inferred_from}: the same engine but for a max_num_seqs "
            "neither reached; its levels are that trial's, and no worker was started.",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def _summary_lines(view: StudyView) -> list[str]:
    cfg, rec = view.cfg, view.rec
    out = [f"# Study {view.record.name}", ""]
    if rec is None:
        from autotune.report.recommend import no_feasible_reason

        out += [f"**No recommendation**: {no_feasible_reason(view.trials, cfg.mode)}", ""]
    else:
        t = rec.trial
        rps = capacity_rps(t)
        bound = rec.capacity()
        cap = f" at x{t.capacity_scale:.3f}" if t.capacity_scale is not None else ""
        cap += f" ({rps:,.2f} req/s)" if rps is not None else ""
        if bound is not None and not bound.exact:  # docs/usage.md#1-commands
            cap = f" at {bound.text()}"
        if not t.feasible:  # a baseline kept on its validation: its validated figures follow
            cap = ", infeasible in the study"
        # undecided: no config held its SLOs in every validation run, no command
        # (docs/tuning.md#7-validation)
        head = "No recommendation; the study's best, not validated" if rec.undecided else ""
        out += [
            f"**{head or 'Recommended'}**: trial {t.optuna_trial_number} ({t.stage}), "
            f"{t.objective or 0:,.1f} output tok/s{cap}",
            "",
            f"**Gain over vLLM's defaults**: {gain_text(rec)}",
            "",
            *([] if rec.undecided else ["```", rec.command, "```", ""]),
        ]
        # the validation's verdict and each config's validated figures, and what to change
        checked = [*format_validation(rec), *validation_block(rec)] if rec.validation else []
        checked += study_hints(rec)
        out += [*(f"- {line.strip()}" for line in checked), ""] if checked else []
    out += [_table(("", ""), details(view)), ""]
    return out


def _comparison_lines(view: StudyView) -> list[str]:
    rows = baseline_comparison(view)
    if not rows:
        return []
    return ["## Baseline comparison", "", _table(("", "baseline", "recommended"), rows), ""]


def _history_lines(view: StudyView) -> list[str]:
    steps = stage_history(view)
    rows = [
        (s.stage, ", ".join(map(str, s.trials)), s.changed, s.why, s.bottleneck or "-", s.outcome)
        for s in steps
    ]
    head = ("stage", "trials", "changed", "why", "bottleneck before", "outcome")
    return ["## History, stage by stage", "", _table(head, rows), ""]


def study_note(view: StudyView) -> str:
    """The plan and its progress, the recommendation with its interval, the baseline
    comparison and the history."""
    st = view.cfg.strategy
    plan = (
        f"**Plan**: strategy `{st.name}`, at most {st.n_trials} trials "
        f"({len(view.complete)} complete); the objective is output tok/s at capacity, the "
        "constraints are Optuna's margins (> 0 is violated)."
    )
    lines = _summary_lines(view)
    lines[2:2] = [plan, ""]
    return "\n".join(lines + _comparison_lines(view) + _history_lines(view)).rstrip() + "\n"


def markdown_report(view: StudyView, *, max_trials: int = 50) -> str:
    """The summary, baseline comparison, history and trials table, for pull requests."""
    lattice = lattice_of(view.cfg)
    rows = []
    for t in view.trials[:max_trials]:
        lv = t.headline_level()
        rows.append(
            (
                t.optuna_trial_number,
                t.stage,
                state_word(t.state),
                *(t.engine_args.get(k, "-") for k in ENGINE_KEYS),
                _num(t.objective),
                capacity_cell(t, lattice, view.cfg.mode),
                figure_cell(lv, "p99_ttft_ms"),
                figure_cell(lv, "p99_tpot_ms"),
                why_infeasible(t, view.cfg.mode) or ("ok" if t.feasible else "-"),
            )
        )
    head = (
        "trial",
        "stage",
        "state",
        *ENGINE_KEYS,
        "output tok/s",
        "capacity req/s",
        "p99 TTFT ms",
        "p99 TPOT ms",
        "result",
    )
    more = len(view.trials) - max_trials
    tail = [f"... and {more} more trials (`autotune study show`)", ""] if more > 0 else []
    return (
        "\n".join(
            _summary_lines(view)
            + _comparison_lines(view)
            + _history_lines(view)
            + ["## Trials", "", _table(head, rows), "", *tail]
        ).rstrip()
        + "\n"
    )
