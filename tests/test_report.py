"""What a finished study shows: optuna-dashboard's API (metric name, constraints, engine
values, notes, plots), the offline HTML report rendered in headless Chromium, and the
terminal commands (`show` at 100 columns, `best`, `--json`, `export`, `delete`, read-only
commands that create no database). One small study serves every test of the module."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.chromium import chromium, ink, render
from support.cli_main import run_main
from support.processes import free_port
from support.services import need_service
from support.studies import config

from autotune.profiles.flags import flag_key, flag_table
from autotune.report.plots import PLOT_IDS
from autotune.store import Store, TrialRecord
from autotune.tuning.attrs import CONSTRAINTS_KEY, constraint_order
from autotune.tuning.measure.scoring import CONSTRAINT_NAMES
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study

NAME = "t"


@dataclass
class Study:
    url: str
    db: Path
    trials: list[TrialRecord]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    """Baseline, an enqueued config with one sequence at a time (infeasible at every load,
    its levels measured), then one trial per stage and one joint trial."""
    db = tmp_path_factory.mktemp("report") / "r.db"
    url = f"sqlite:///{db}"
    cfg, text = config(
        enqueue=[{"max_num_seqs": 1}],
        workload={"num_prompts": 60},
        # validation off: the notes say "not validated" (the validated phrases are tested
        # in tests/test_report_parts.py), and the module stays quick
        # every trial measured in full, so the fixture holds each kind of figure (settled
        # trials are shown in tests/test_settle.py)
        strategy={
            "settle": False,
            "n_trials": 7,
            "trials_per_stage": 1,
            "joint_refinement": 1,
            "validate": {"enabled": False},
        },
    )
    with Store.open(url) as store:
        create_study(cfg, text, store)
        run_study(NAME, store)
        trials = store.trials(NAME)
    yield Study(url, db, trials)


def test_the_fixture_has_feasible_and_infeasible_trials(study: Study) -> None:
    done = [t for t in study.trials if t.state == "COMPLETE"]
    assert len(done) == 7
    bad = [t for t in done if not t.feasible]
    assert "enqueue-0" in [t.stage for t in bad] and all(t.levels for t in bad)  # measured
    assert any(t.feasible for t in done)


# -- optuna-dashboard -------------------------------------------------------------------------


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_dashboard_api_shows_names_constraints_engine_values_and_notes(study: Study) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "dashboard",
            NAME,
            "--storage",
            study.url,
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "the dashboard did not answer in 60 s"
                time.sleep(0.2)
        (sid,) = [s["study_id"] for s in studies if s["study_name"] == NAME]
        body = _get(f"http://127.0.0.1:{port}/api/studies/{sid}")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert f"127.0.0.1:{port}/dashboard/studies/{sid}" in out  # the printed URL
    assert body["objective_names"] == ["output tok/s at capacity"]
    by_number = {t["number"]: t for t in body["trials"]}
    records = {t.optuna_trial_number: t for t in study.trials}
    for number, t in by_number.items():
        rec = records[number]
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        # one attribute per engine value, as vLLM got it, numbers as numbers
        for k, v in rec.engine_args.items():
            assert attrs[f"engine.{k}"] == str(v), (number, k)
        assert "null" not in attrs.values() and not any(v.startswith("{") for v in attrs.values())
        assert len(t["constraints"]) == 4
        if rec.feasible:
            assert all(c <= 0 for c in t["constraints"])
        else:  # the dashboard marks it infeasible
            assert any(c > 0 for c in t["constraints"]), t["constraints"]
            assert attrs["why_infeasible"].startswith(
                ("capacity below the lowest load tried", "requests too long for max_model_len")
            )
        assert t["note"]["body"].startswith(f"## Trial {number}")
        assert "### Load levels" in t["note"]["body"]
    sortable = {a["key"]: a["sortable"] for a in body["union_user_attrs"]}
    assert sortable["engine.max_num_batched_tokens"] and sortable["p99_ttft_ms"]
    assert "Gain over vLLM's defaults" in body["note"]["body"]
    assert "(not validated)" in body["note"]["body"]
    assert {g["id"] for g in body["plotly_graph_objects"]} == set(PLOT_IDS)


def test_optuna_sees_exactly_the_four_named_constraints(study: Study) -> None:
    with Store.open(study.url) as store:
        ostudy = optuna.load_study(study_name=NAME, storage=store.optuna_storage())
        frozen = ostudy.get_trials()
        legend = ostudy.user_attrs[CONSTRAINTS_KEY]
    names = constraint_order(CONSTRAINT_NAMES)
    assert legend == ", ".join(f"{i}: {n}" for i, n in enumerate(names)) + " (> 0 is violated)"
    records = {t.optuna_trial_number: t for t in study.trials}
    for ft in frozen:
        assert set(ft.constraints) == {"0", "1", "2", "3"}  # no "p99_ttft" twin
        assert not any(k.startswith(f"{CONSTRAINTS_KEY}:") for k in ft.system_attrs)
        # the values are the stored trial's, in the named order
        assert list(ft.constraints.values()) == records[ft.number].constraints
        feasible = all(v <= 0 for v in ft.constraints.values())
        assert feasible == records[ft.number].feasible


# -- the HTML report ---------------------------------------------------------------------------


def test_html_report_renders_offline_with_every_plot_drawn(
    study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need_service("chromium", chromium() is not None, "install Debian's chromium")
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    code, _out, err = run_main(
        ["report", NAME, "--storage", study.url, "--html", str(html), "--md", str(md)], capsys
    )
    assert code == 0, err
    text = html.read_text()
    assert "<script src" not in text and text.count("Plotly.newPlot") == len(PLOT_IDS)
    result = render(html)
    # with unshare unavailable only name resolution is cut: nothing may point off the file
    offsite = [link for link in result.links if re.match(r"(?i)(https?:)?//", link)]
    assert offsite == []
    shots = {s.id: s for s in result.plots}
    assert list(shots) == list(PLOT_IDS)
    done = [t for t in study.trials if t.state == "COMPLETE"]
    # one marker per completed trial, feasible and infeasible traces together
    for pid in ("throughput-vs-ttft", "throughput-vs-tpot"):
        assert sum(shots[pid].points) == len(done), (pid, shots[pid].points)
        assert shots[pid].points[1] == sum(1 for t in done if not t.feasible)
    assert shots["parameter-importance"].bars > 0
    for s in result.plots:
        share, variance = ink(s.png)
        assert s.width > 300 and s.height > 200, s.id
        assert variance > 0 and share > 0.01, (s.id, share, variance)
    summary = md.read_text()
    for heading in ("## Baseline comparison", "## History, stage by stage", "## Trials"):
        assert heading in summary
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in summary


# -- terminal ---------------------------------------------------------------------------------


def test_show_fits_100_columns_and_cuts_no_numbers(
    study: Study, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run_main(["study", "show", NAME, "--storage", study.url], capsys)
    assert code == 0
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    assert "…" not in out
    header = next(ln for ln in lines if ln.lstrip().startswith("trial"))
    assert "state" in header and "violation" in header
    code, js, _ = run_main(["study", "show", NAME, "--storage", study.url, "--json"], capsys)
    rows = json.loads(js)["trials"]
    tokens = set(out.split())
    for r in rows:
        ea = r["engine_args"]
        expected = [str(r["trial"]), *(f"{ea[k]:g}" for k in ("max_model_len", "max_num_seqs"))]
        expected += [f"{ea['gpu_memory_utilization']:g}", f"{ea['max_num_batched_tokens']:g}"]
        expected.append(f"{r['output_tok_s']:,.1f}")
        if r["capacity_rps"] is not None:
            expected.append(f"{r['capacity_rps']:,.2f}")
        for v in expected:
            assert v in tokens, (r["trial"], v)
    # the infeasible trial's violation is there, its numbers whole
    bad = next(r for r in rows if r["feasible"] is False)
    for word in " ".join(bad["violations"]).split():
        assert word in tokens, word
    code, wide, _ = run_main(["study", "show", NAME, "--storage", study.url, "--wide"], capsys)
    assert "max_num_batched_tokens" in wide and "KV cache tokens" in wide


def _parse_serve(command: str) -> dict[str, Any]:
    """`vllm serve MODEL --flag value ...` back into engine args, as vLLM's parser reads
    them (the flag table's kinds)."""
    words = shlex.split(command)
    assert words[:2] == ["vllm", "serve"]
    table, out, i = flag_table(), {}, 3
    while i < len(words):
        spec = table.by_option[words[i]]
        if spec.kind in ("flag", "bool"):
            out[flag_key(words[i]).removeprefix("no_")] = not words[i].startswith("--no-")
            i += 1
            continue
        value: Any = words[i + 1]
        value = {"int": int, "human_int": int, "float": float}.get(spec.kind, str)(value)
        out[spec.dest] = value
        i += 2
    return out


def test_best_prints_a_command_that_parses_back_into_its_engine_args(
    study: Study, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(["study", "best", NAME, "--storage", study.url], capsys)
    assert code == 0
    assert "validation: not validated (strategy.validate: off)" in out, out
    code, js, _ = run_main(["study", "best", NAME, "--storage", study.url, "--json"], capsys)
    best = json.loads(js)
    assert best["schema"] == "autotune.study-best/1"
    assert _parse_serve(out.splitlines()[0]) == best["engine_args"]
    assert _parse_serve(best["command"]) == best["engine_args"]
    assert shlex.join(best["argv"]) == best["command"]
    assert best["gain"]["validated"] is False and best["gain"]["interval"] is None
    assert best["gain"]["text"].endswith("(not validated)")
    rec = next(t for t in study.trials if t.optuna_trial_number == best["trial"])
    assert best["engine_args"] == rec.engine_args and best["output_tok_s"] == rec.objective


def test_list_json_and_export_without_telemetry(
    study: Study, capsys: pytest.CaptureFixture[str]
) -> None:
    code, js, _ = run_main(["study", "list", "--storage", study.url, "--json"], capsys)
    assert code == 0
    listed = json.loads(js)
    assert listed["schema"] == "autotune.study-list/1"
    (row,) = listed["studies"]
    assert row["name"] == NAME and row["complete"] == 7 and row["best_output_tok_s"] > 0
    _, slim, _ = run_main(["study", "export", NAME, "--storage", study.url], capsys)
    _, full, _ = run_main(["study", "export", NAME, "--storage", study.url, "--full"], capsys)
    s, f = json.loads(slim), json.loads(full)
    assert s["schema"] == f["schema"] == "autotune.study-export/1"
    lv = s["trials"][0]["levels"][0]
    assert "telemetry" not in lv and "metrics" not in lv
    assert {"p99_ttft_ms", "violations", "diagnosis", "offered_rate"} <= set(lv)
    assert f["trials"][0]["levels"][0]["telemetry"]["series"]["t"]
    assert len(slim) < len(full) / 3


def test_read_only_commands_create_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    url = f"sqlite:///{db}"
    code, out, _ = run_main(["study", "list", "--storage", url, "--json"], capsys)
    assert code == 0 and json.loads(out)["studies"] == []
    for args in (
        ["study", "show", NAME],
        ["study", "best", NAME],
        ["study", "export", NAME],
        ["study", "run", NAME],
        ["study", "delete", NAME, "--yes"],
        ["report", NAME, "--md", str(tmp_path / "x.md")],
        ["dashboard", NAME],
    ):
        code, _, err = run_main([*args, "--storage", url], capsys)
        assert code == 4, args
        assert err.startswith(f"error: no study named {NAME!r}: no study database at"), err
        assert err.count("\n") == 1
    assert not db.exists() and list(tmp_path.iterdir()) == []


def test_delete_asks_unless_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    cfg, text = config()
    with Store.open(url) as store:
        create_study(cfg, text, store)
    code, _, err = run_main(["study", "delete", NAME, "--storage", url], capsys)
    assert code == 1 and "pass --yes" in err  # no terminal to ask on
    monkeypatch.setattr(sys, "stdin", _Answer("n\n"))
    code, out, _ = run_main(["study", "delete", NAME, "--storage", url], capsys)
    assert code == 1 and f"study {NAME!r} kept" in out
    with Store.open(url) as store:
        assert store.get_study(NAME) is not None
    monkeypatch.setattr(sys, "stdin", _Answer("y\n"))
    code, out, _ = run_main(["study", "delete", NAME, "--storage", url], capsys)
    assert code == 0 and f"study {NAME!r} deleted" in out
    code, out, _ = run_main(["study", "list", "--storage", url, "--json"], capsys)
    assert json.loads(out)["studies"] == []


class _Answer:
    """A terminal stdin that answers one line."""

    def __init__(self, text: str) -> None:
        self._lines = [text]

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self._lines.pop(0) if self._lines else ""

    def fileno(self) -> int:
        raise OSError("not a real terminal")


@pytest.mark.parametrize(
    ("args", "module"),
    [(["report", NAME, "--html", "x.html"], "plotly"), (["dashboard", NAME], "optuna_dashboard")],
)
def test_missing_report_extra_is_one_line_naming_it(
    study: Study,
    args: list[str],
    module: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "autotune.report.html", raising=False)
    monkeypatch.delitem(sys.modules, "autotune.report.plots", raising=False)
    monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    code, _, err = run_main([*args, "--storage", study.url], capsys)
    assert code == 1
    assert (
        err == f"error: autotune {args[0]}{' --html' if args[0] == 'report' else ''} needs "
        f"{module}, which is not installed: pip install 'autotune[report]'\n"
    )
    assert os.path.exists(study.db)


def test_a_simulated_study_states_the_simulators_error_and_a_real_one_does_not(
    study: Study, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/simulator.md#9-accuracy-against-published-measurements: the line appears in
    `study best` (text and JSON), the Markdown report and the dashboard's study note of a
    study on a simulated worker, and never for a `vllm` worker."""
    from autotune.report.best_output import best_json, format_recommendation
    from autotune.report.notes import markdown_report, study_note
    from autotune.report.recommend import recommend
    from autotune.report.study_view import StudyView
    from autotune.sim import planning_error
    from autotune.tuning.measure.cost import study_cost

    line = planning_error("A100-80GB").text()
    assert line.startswith("planned on the simulator: ") and "A100" in line
    code, out, _ = run_main(["study", "best", NAME, "--storage", study.url], capsys)
    assert code == 0 and line in out
    _, js, _ = run_main(["study", "best", NAME, "--storage", study.url, "--json"], capsys)
    assert json.loads(js)["planning_error"]["text"] == line
    with Store.open(study.url) as store:
        record = store.get_study(NAME)
    assert record is not None
    for kind in ("sim", "sim-virtual", "vllm"):
        cfg, _ = config(workload={"num_prompts": 60}, worker={"kind": kind})
        rec = recommend(cfg, study.trials)
        assert rec is not None
        view = StudyView(record, cfg, study.trials, rec, study_cost(study.trials, ()))
        shown = [
            format_recommendation(rec),
            json.dumps(best_json(NAME, rec), ensure_ascii=False),
            markdown_report(view),
            study_note(view),
        ]
        simulated = kind != "vllm"
        assert all((line in text) == simulated for text in shown), kind
        assert (best_json(NAME, rec)["planning_error"] is None) != simulated
