"""``autotune report --html``: one self-contained HTML file (plotly.js inlined once, no
network) with the summary, the baseline comparison, the history stage by stage, the plots
and the trials table (docs/report.md#2-the-html-report). Needs the ``[report]`` extra."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import plotly.graph_objects as go
import plotly.offline

from autotune.report.best_output import format_validation, study_hints, validation_block
from autotune.report.bounds import capacity_cell, state_word
from autotune.report.levels import figure_cell
from autotune.report.plots import figures
from autotune.report.recommend import gain_text
from autotune.report.study_view import (
    ENGINE_KEYS,
    StudyView,
    baseline_comparison,
    details,
    stage_history,
)
from autotune.tuning.measure.findings import capacity_rps, why_infeasible
from autotune.tuning.measure.level_plan import lattice_of

__all__ = ["PAGE_CSS", "PLOT_CONFIG", "render_html"]

# No plotly logo (a link to plotly.com): the file links nowhere.
PLOT_CONFIG = {"displaylogo": False, "responsive": True}

# shared with the size report (autotune.planning.size_html): one look for every page
PAGE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 10px}
.sub{color:#5b6475;margin:0 0 18px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:16px 20px;margin:0 0 16px}
.big{font-size:1.35em;font-weight:600}.gain{font-size:1.1em}
pre{background:#11151c;color:#e6edf3;padding:12px 14px;border-radius:6px;overflow-x:auto;
white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.9em}
th,td{border-bottom:1px solid #e3e6eb;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5;position:sticky;top:0}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{color:#9a1c1c}tr.best td{background:#eaf6ea}
table.kv td:first-child{color:#5b6475;white-space:nowrap;width:1%}
.plot{background:#fff;border:1px solid #dde1e8;border-radius:8px;margin:0 0 16px;padding:4px}
th.sortable{cursor:pointer}.wide{overflow-x:auto}
table.sortable{font-size:.82em}
"""

# Click a header of the trials table to sort by it (numbers as numbers).
_SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,i){th.classList.add('sortable');
  th.addEventListener('click',function(){var b=t.tBodies[0],r=[].slice.call(b.rows),
  d=th.dataset.d==='1'?-1:1;th.dataset.d=d===1?'1':'0';
  function v(x){var s=x.cells[i].dataset.v||x.cells[i].textContent,n=parseFloat(s);
  return isNaN(n)?s:n}
  r.sort(function(a,c){var p=v(a),q=v(c);return (p>q?1:p<q?-1:0)*d});
  r.forEach(function(x){b.appendChild(x)})})})});
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _num(v: float | None, fmt: str = ",.1f") -> str:
    return "-" if v is None else format(v, fmt)


def _summary(view: StudyView) -> str:
    rec = view.rec
    if rec is None:
        from autotune.report.recommend import no_feasible_reason

        why = no_feasible_reason(view.trials, view.cfg.mode)
        head = f'<p class="big">No recommendation: {_e(why)}</p>'
    else:
        t = rec.trial
        rps = capacity_rps(t)
        bound = rec.capacity()
        cap = f"x{t.capacity_scale:.3f} of the workload's rate" if t.capacity_scale else ""
        cap += f" ({rps:,.2f} req/s)" if rps is not None else ""
        if bound is not None and not bound.exact:  # the top of the range: a lower bound
            cap = f"{bound.text()} of the workload's rate"
        big = (
            f"{t.objective or 0:,.1f} output tok/s at capacity {cap}"
            if t.feasible
            else f"trial {t.optuna_trial_number} was infeasible in the study; validated below"
        )
        checked = [*format_validation(rec), *validation_block(rec)] if rec.validation else []
        checked += study_hints(rec)
        items = "".join(f"<li>{_e(line.strip())}</li>" for line in checked)
        head = (
            f'<p class="big">{_e(big)}</p>'
            f'<p class="gain">Gain over vLLM\'s defaults: <b>{_e(gain_text(rec))}</b></p>'
            + (f"<ul>{items}</ul>" if items else "")
        )
        # undecided: no config held its SLOs in every validation run, so no command
        # (docs/tuning.md#7-validation)
        head += (
            f"<p>No recommendation; the study's best, not validated: trial "
            f"{t.optuna_trial_number} ({_e(t.stage)})</p>"
            if rec.undecided
            else f"<p>Recommended: trial {t.optuna_trial_number} ({_e(t.stage)})</p>"
            f"<pre><code>{_e(rec.command)}</code></pre>"
        )
    return f'<div class="card">{head}{_kv(details(view))}</div>'


def _history(view: StudyView) -> str:
    rows = [
        (s.stage, ", ".join(map(str, s.trials)), s.changed, s.why, s.bottleneck or "-", s.outcome)
        for s in stage_history(view)
    ]
    return _table(("stage", "trials", "changed", "why", "bottleneck before", "outcome"), rows)


def _trials(view: StudyView) -> str:
    best = view.rec.trial.optuna_trial_number if view.rec is not None else None
    lattice = lattice_of(view.cfg)
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
        "bottleneck",
    )
    numeric = {0, 3, 4, 5, 6, 7, 8, 9, 10}
    th = "".join(
        f'<th class="{"n" if i in numeric else ""}">{_e(h)}</th>' for i, h in enumerate(head)
    )
    body = []
    for t in view.trials:
        lv = t.headline_level()
        cells = (
            t.optuna_trial_number,
            t.stage,
            state_word(t.state),
            *(t.engine_args.get(k, "-") for k in ENGINE_KEYS),
            _num(t.objective),
            capacity_cell(t, lattice, view.cfg.mode),
            figure_cell(lv, "p99_ttft_ms"),
            figure_cell(lv, "p99_tpot_ms"),
            why_infeasible(t, view.cfg.mode) or ("ok" if t.feasible else "-"),
            (t.diagnosis or {}).get("kind") or "-",
        )
        cls = "best" if t.optuna_trial_number == best else ("bad" if t.feasible is False else "")
        tds = "".join(
            f'<td class="{"n" if i in numeric else ""}" data-v="{_e(str(c).replace(",", ""))}">'
            f"{_e(c)}</td>"
            for i, c in enumerate(cells)
        )
        body.append(f'<tr class="{cls}">{tds}</tr>')
    rows = "".join(body)
    return (
        f'<div class="wide"><table class="sortable"><thead><tr>{th}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
    )


def render_html(view: StudyView, figs: Mapping[str, go.Figure] | None = None) -> str:
    """The whole report as one HTML document."""
    figs = figures(view) if figs is None else figs
    plots = "".join(
        '<div class="plot">'
        + fig.to_html(full_html=False, include_plotlyjs=False, div_id=fid, config=PLOT_CONFIG)
        + "</div>"
        for fid, fig in figs.items()
    )
    cmp_rows = baseline_comparison(view)
    comparison = (
        _table(("", "baseline", "recommended"), cmp_rows)
        if cmp_rows
        else "<p>No comparison: the study has no feasible recommendation or no baseline.</p>"
    )
    name = _e(view.record.name)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>autotune report: {name}</title><style>{PAGE_CSS}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        "</head><body><main>"
        f"<h1>autotune report: study {name}</h1>"
        f'<p class="sub">{_e(view.cfg.mode)} on {_e(view.cfg.hardware)}, generated {when}</p>'
        f'<h2 id="summary">Summary</h2>{_summary(view)}'
        f'<h2 id="baseline">Baseline comparison</h2>{comparison}'
        f'<h2 id="history">History, stage by stage</h2>{_history(view)}'
        f'<h2 id="plots">Plots</h2>{plots}'
        f'<h2 id="trials">Trials</h2>{_trials(view)}'
        f"</main><script>{_SORT_JS}</script></body></html>\n"
    )
