"""Capacities as bounds (autotune/report/bounds.py, docs/usage.md#1-commands) and the
validated figures (autotune/report/validated.py, docs/tuning.md#7-validation) wherever a
study is read: ``study show``, ``study best``, the exports.

A trial whose capacity search ended at the top of the lattice shows "≥ … (top of the
range)", one that failed even at the bottom "< … (the lowest load tried)", never an exact
figure; the widening hint appears when the best config is at the top and not otherwise.
After validation both ``study best`` and ``study show`` print each config's validated
capacity, runs held and gain interval; a baseline infeasible in the study but validated
shows its validated capacity."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support.runners import NoisyRunner
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.report.best_output import format_recommendation
from autotune.report.bounds import gain_bound_text, trial_capacity, widen_hint
from autotune.report.notes import markdown_report
from autotune.report.recommend import recommend
from autotune.report.study_view import study_view
from autotune.store import LevelRecord, Store, TrialRecord
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.measure.validate import run_validation
from autotune.tuning.run import create
from autotune.tuning.run.events import TrialDone

RATE = 4.0  # the BASE workload's rate (tests/support/studies.py)


def _lv(scale: float, ok: bool, violation: str = "p99_ttft_ms") -> LevelRecord:
    bad = [{"name": violation, "value": 5000.0, "limit": 3000.0, "text": f"{violation} broke"}]
    return LevelRecord(
        level_index=0,
        scale=scale,
        offered_rate=RATE * scale,
        achieved_rate=RATE * scale,
        completed=100,
        failed=0,
        over_length=0,
        error_rate=0.0,
        p99_ttft_ms=100.0 if ok else 5000.0,
        p99_tpot_ms=20.0,
        p99_itl_ms=None,
        output_throughput=1000.0 * scale,
        request_throughput=RATE * scale,
        goodput=None,
        feasible=ok,
        metrics={},
        violations=[] if ok else bad,
    )


def _trial(n: int, levels: list[LevelRecord], cap: float | None, seqs: int = 0) -> TrialRecord:
    ok = cap is not None
    for i, lv in enumerate(levels):  # in the order measured
        lv.level_index = i
    return TrialRecord(
        study_name="t",
        optuna_trial_number=n,
        stage="baseline" if n == 0 else "joint",
        state="COMPLETE",
        params={},
        engine_args={"max_num_seqs": seqs or n + 1},
        launch_command=None,
        launch_argv=None,
        worker_kind="sim-virtual",
        objective=1000.0 * cap if cap is not None else 0.0,
        feasible=ok,
        capacity_scale=cap,
        levels=levels,
    )


def _trials(cfg: Any, at_top: bool = True) -> list[TrialRecord]:
    """0: the baseline, found at the middle; 1: feasible at the top of the lattice (or,
    without ``at_top``, found one point below it); 2: infeasible even at the bottom."""
    lat = lattice_of(cfg)
    top, mid = lat.scale(lat.top), lat.scale(lat.top // 2)
    below = lat.scale(lat.top - 1)
    best = (
        _trial(1, [_lv(top, True)], top)
        if at_top
        else _trial(1, [_lv(top, False), _lv(below, True)], below)
    )
    return [
        _trial(0, [_lv(top, False), _lv(mid, True), _lv(lat.scale(lat.top // 2 + 1), False)], mid),
        best,
        _trial(2, [_lv(top, False), _lv(mid, False), _lv(lat.low, False)], None),
    ]


def test_a_capacity_at_the_top_is_a_lower_bound_and_one_below_the_bottom_an_upper() -> None:
    cfg, _ = config()
    lat = lattice_of(cfg)
    base, top, low = _trials(cfg)
    c = trial_capacity(top, lat, cfg.mode)
    assert c is not None and c.status == "at_top"
    top_rps = RATE * lat.scale(lat.top)
    assert c.rps_text() == f"≥ {top_rps:,.2f} req/s (top of the range)"
    assert c.text().startswith(f"≥ x{lat.scale(lat.top):.3f} (≥ {top_rps:,.2f} req/s")
    b = trial_capacity(low, lat, cfg.mode)
    assert b is not None
    assert b.rps_text() == f"< {RATE * lat.low:,.2f} req/s (the lowest load tried)"
    exact = trial_capacity(base, lat, cfg.mode)
    assert exact is not None and exact.exact
    assert exact.rps_text() == f"{RATE * lat.scale(lat.top // 2):,.2f} req/s"
    # without the lattice: nothing measured above its capacity makes it a lower bound too
    fallback = trial_capacity(top, None, cfg.mode)
    assert fallback is not None and fallback.bound == "≥"
    nofb = trial_capacity(base, None, cfg.mode)
    assert nofb is not None and nofb.exact
    # a gain from a capacity at the top is a bound; from two, no figure at all
    assert gain_bound_text(12.34, "at_top", None) == "≥ +12.3 %"
    assert gain_bound_text(12.34, None, "at_top") == "≤ +12.3 %"
    assert gain_bound_text(12.34, "found", "found") == "+12.3 %"
    assert gain_bound_text(0.0, "at_top", "at_top").startswith("n/a")
    assert widen_hint(exact, 4.0) is None and widen_hint(None, 4.0) is None


def _stored(tmp_path: Path, trials: list[TrialRecord], **over: Any) -> tuple[Any, str]:
    cfg, text = config(**over)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Store.open(url) as store:
        create.create_study(cfg, text, store)  # with its Optuna study, as `study create`
        for t in trials:
            store.add_trial(t)
    return cfg, url


def test_study_best_and_show_say_so_and_suggest_widening_at_the_top(tmp_path: Path) -> None:
    cfg, _ = config()
    trials = _trials(cfg)
    rec = recommend(cfg, trials)
    assert rec is not None and rec.trial.optuna_trial_number == 1
    text = format_recommendation(rec)
    lat = lattice_of(cfg)
    top, mid = lat.scale(lat.top), lat.scale(lat.top // 2)
    bound = f"≥ x{top:.3f} (≥ {RATE * top:,.2f} req/s; top of the range)"
    assert f"at {bound} of the workload's rate" in text
    assert f"at {top:.3f}x" not in text and f"({RATE * top:,.2f} req/s)" not in text
    # the gain from a capacity at the top is a lower bound
    gain = f"{100 * (top / mid - 1):+.1f} %"
    assert f"vLLM defaults {1000 * mid:,.1f} tok/s): ≥ {gain.replace(' ', '')} in the study" in text
    widen = [ln for ln in text.splitlines() if ln.startswith("widen the range")]
    assert len(widen) == 1 and "strategy.capacity_high: 8 (2x)" in widen[0]

    cfg, url = _stored(tmp_path, trials)
    cli = CliRunner()
    show = cli.invoke(app, ["study", "show", "t", "--storage", url])
    assert show.exit_code == 0, show.output
    said = " ".join(show.output.split())  # the terminal wraps the lines under the table
    assert f"≥{RATE * top:,.2f}" in said and f"<{RATE * lat.low:,.2f}" in said
    assert "≥ = at least (the top of the range), < = below the lowest load tried" in said
    assert "strategy.capacity_high: 8 (2x)" in said
    rows = json.loads(cli.invoke(app, ["study", "show", "t", "--storage", url, "--json"]).output)
    caps = {r["trial"]: r["capacity"] for r in rows["trials"]}
    assert (caps[0]["bound"], caps[1]["status"], caps[2]["status"]) == ("", "at_top", "below_low")
    assert rows["hints"] and rows["validation"] is None
    best = cli.invoke(app, ["study", "best", "t", "--storage", url])
    assert "strategy.capacity_high: 8 (2x)" in best.output
    got = json.loads(cli.invoke(app, ["study", "best", "t", "--storage", url, "--json"]).output)
    assert got["capacity"]["status"] == "at_top" and got["gain"]["in_study_text"] == f"≥ {gain}"
    # the exports carry the status beside the number
    out = cli.invoke(app, ["study", "export", "t", "--format", "csv", "--storage", url])
    by = {r["trial"]: r for r in csv.DictReader(io.StringIO(out.output))}
    assert (by["1"]["capacity_status"], by["1"]["capacity_bound"]) == ("at_top", "≥")
    assert by["2"]["capacity_bound"] == "<" and by["0"]["capacity_bound"] == ""
    out = cli.invoke(app, ["study", "export", "t", "--format", "json", "--storage", url])
    exported = {t["optuna_trial_number"]: t for t in json.loads(out.output)["trials"]}
    assert exported[1]["capacity"]["bound"] == "≥" and exported[1]["capacity_scale"] == top


def test_no_widening_hint_when_the_best_is_below_the_top(tmp_path: Path) -> None:
    cfg, url = _stored(tmp_path, _trials(config()[0], at_top=False))
    rec = recommend(cfg, _trials(cfg, at_top=False))
    assert rec is not None and rec.trial.optuna_trial_number == 1
    text = format_recommendation(rec)
    assert "widen the range" not in text and "≥" not in text
    show = CliRunner().invoke(app, ["study", "show", "t", "--storage", url])
    said = " ".join(show.output.split())
    assert show.exit_code == 0 and "widen the range" not in said
    lat = lattice_of(cfg)
    below = RATE * lat.scale(lat.top - 1)
    assert f" {below:,.2f} " in said and f"≥{below:,.2f}" not in said  # its exact capacity
    assert f"<{RATE * lat.low:,.2f}" in said  # trial 2's, below the bottom, still a bound


def _validated(
    tmp_path: Path, spec: Mapping[int, tuple[float, float]], trials: list[TrialRecord]
) -> tuple[Any, str]:
    """A stored study of ``trials`` (engine max_num_seqs keys ``spec``) validated by the
    scripted runner: 2 candidates, 3 repeats."""
    st = {"name": "joint", "capacity_levels": 24, "validate": {"top_k": 2, "repeats": 3}}
    cfg, url = _stored(tmp_path, trials, strategy=st)
    with Store.open(url) as store:
        asyncio.run(
            run_validation(
                cfg,
                store,
                "t",
                make_runner=lambda seed: NoisyRunner(seed, spec, []),
                vocab_size=32000,
            )
        )
    return cfg, url


def test_best_show_and_export_carry_the_validated_capacities(tmp_path: Path) -> None:
    # trial 2's true capacity lies above the lattice: every run of it ends at the top
    spec = {1: (1.0, 0.02), 2: (1.5, 0.02), 3: (9.0, 0.02)}
    trials = [_trial(n, [], c) for n, c in ((0, 1.0), (1, 1.5), (2, 3.0))]
    cfg, url = _validated(tmp_path, spec, trials)
    cli = CliRunner()
    best = cli.invoke(app, ["study", "best", "t", "--storage", url])
    show = cli.invoke(app, ["study", "show", "t", "--storage", url], env={"COLUMNS": "400"})
    assert best.exit_code == 0 and show.exit_code == 0, best.output + show.output
    for out in (best.output, show.output):
        lines = out.splitlines()
        base = next(ln for ln in lines if ln.startswith("  baseline, trial 0: "))
        assert "the SLOs held in 4 of 4 runs; validated capacity x" in base
        assert "req/s)" in base and "≥" not in base
        one = next(ln for ln in lines if ln.startswith("  trial 1: "))
        assert "validated capacity x1.4" in one and "95 % CI" in one and "3 paired runs" in one
        top = next(ln for ln in lines if ln.startswith("  trial 2: "))
        # at the top in every run: its capacity and its gain are lower bounds
        assert "validated capacity ≥ x3.974 (≥ 15.90 req/s; top of the range)" in top
        assert "over the baseline ≥ +" in top and "reached the top of the range in 3 runs" in top
        assert "strategy.capacity_high: 8 (2x)" in out  # the recommended config is at the top
    assert "validated gain in SLO capacity over the baseline: ≥ +" in best.output
    body = json.loads(cli.invoke(app, ["study", "export", "t", "--storage", url]).output)
    configs = {c["trial"]: c for c in body["validation"]["configs"]}
    assert configs[0]["role"] == "baseline" and configs[0]["runs_held"] == 4
    assert configs[2]["capacity"]["status"] == "at_top" and configs[2]["gain"]["bound"] == "≥"
    assert configs[1]["gain"]["interval"]["n"] == 3 and configs[1]["capacity"]["bound"] == ""
    shown = json.loads(cli.invoke(app, ["study", "show", "t", "--storage", url, "--json"]).output)
    assert shown["validation"]["verdict"] == body["validation"]["summary"]["verdict"]
    assert [c["trial"] for c in shown["validation"]["configs"]] == [0, 1, 2]
    # the Markdown report (and the dashboard's study note, from the same lines) too
    with Store.open(url) as store:
        record = store.get_study("t")
        assert record is not None
        view = study_view(record, cfg, store.trials("t"), store.repeats("t"))
    md = markdown_report(view)
    assert "- baseline, trial 0: the SLOs held in 4 of 4 runs; validated capacity x" in md
    assert "| validated capacity | x" in md and "≥ x3.974" in md
    res = cli.invoke(app, ["study", "export", "t", "--format", "csv", "--storage", url])
    by = {r["trial"]: r for r in csv.DictReader(io.StringIO(res.output))}
    assert by["0"]["validated_slo_held"] == "4/4" and by["0"]["validated_capacity_scale"]
    assert by["2"]["validated_capacity_bound"] == "≥" and by["1"]["validated_paired_runs"] == "3"


def test_a_baseline_infeasible_in_the_study_shows_its_validated_capacity(tmp_path: Path) -> None:
    # the baseline broke only the over-length limit in the study (judged pooled over its
    # repeats in validation, where it held): kept on its validated capacity
    spec = {1: (1.0, 0.02), 2: (1.0, 0.02), 3: (1.0, 0.02)}
    over = _lv(1.0, False, "overlength_rate")
    trials = [_trial(0, [over], None), _trial(1, [], 1.0), _trial(2, [], 0.9)]
    _, url = _validated(tmp_path, spec, trials)
    cli = CliRunner()
    best = cli.invoke(app, ["study", "best", "t", "--storage", url])
    assert best.exit_code == 0, best.output
    assert best.output.startswith("vllm serve") and "keep your current config" in best.output
    assert "0.0 output tok/s" not in best.output and "gain over baseline: n/a" not in best.output
    assert "trial 0 (baseline): infeasible in the study: requests too long" in best.output
    base = next(ln for ln in best.output.splitlines() if ln.startswith("  baseline, trial 0: "))
    assert "the SLOs held in 4 of 4 runs; validated capacity x" in base
    show = cli.invoke(app, ["study", "show", "t", "--storage", url], env={"COLUMNS": "400"})
    assert base in show.output.splitlines() and "keep your current config" in show.output


def test_the_progress_line_of_a_trial_at_the_top_is_a_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autotune.cli.progress import progress_printer

    cfg, _ = config()
    lat = lattice_of(cfg)
    base, top, _low = _trials(cfg)
    show = progress_printer()
    for t, status in ((top, "at_top"), (base, "found")):
        show(
            TrialDone(
                t.optuna_trial_number,
                stage=t.stage,
                objective=t.objective or 0.0,
                feasible=True,
                failure_class=None,
                capacity_scale=t.capacity_scale,
                capacity_status=status,
                constraints={},
                mode=cfg.mode,
                record=t,
            )
        )
    at_top, found = capsys.readouterr().out.splitlines()
    s = lat.scale(lat.top)
    assert at_top.endswith(f"at ≥ x{s:.3f} (≥ {RATE * s:,.2f} req/s; top of the range)")
    m = lat.scale(lat.top // 2)
    assert found.endswith(f"at x{m:.3f} ({RATE * m:,.2f} req/s)") and "≥" not in found


def test_a_capacity_measured_more_than_once_shows_its_spread(tmp_path: Path) -> None:
    # the point above the capacity held once and failed twice: its majority failed, the
    # runs went up and down with load, and best, show and the JSON say so
    cfg, _ = config()
    lat = lattice_of(cfg)
    mid, up = lat.scale(lat.top // 2), lat.scale(lat.top // 2 + 1)
    levels = [_lv(lat.scale(lat.top), False), _lv(mid, True), _lv(up, False), _lv(up, True)]
    noisy = _trial(0, [*levels, _lv(up, False)], mid)
    plain = _trial(1, [_lv(lat.scale(lat.top), False), _lv(mid, True), _lv(up, False)], mid)
    rec = recommend(cfg, [noisy])
    assert rec is not None
    text = format_recommendation(rec)
    line = f"  capacity's spread: held 1/1, next point up 1/3; uncertain between x{mid:.3f}"
    assert line in text and "(feasibility went up and down with load)" in text
    other = recommend(cfg, [plain])
    assert other is not None and "capacity's spread" not in format_recommendation(other)
    _, url = _stored(tmp_path, [noisy, plain])
    show = CliRunner().invoke(app, ["study", "show", "t", "--storage", url])
    said = " ".join(show.output.split())
    assert "trial 0 capacity's spread: held 1/1, next point up 1/3" in said
    assert "trial 1 capacity's spread" not in said
    got = CliRunner().invoke(app, ["study", "show", "t", "--json", "--storage", url])
    rows = json.loads(got.output)
    spread = rows["trials"][0]["capacity"]["spread"]
    assert (spread["held"], spread["above_held"], spread["monotone"]) == ("1/1", "1/3", False)
