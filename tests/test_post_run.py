"""What happens after a run's last trial (docs/report.md#7-after-the-run): the dashboard's
notes and plots, the report and the nightly's output file are rendered from what the run
stored, and a failure there costs one warning line, never the run's exit status or the
nightly's decision.

The study here has a baseline whose worker died before any request completed: each of its
levels stored 0 output tok/s and p99 latencies of 0 ms (vLLM's zeros for an empty sample,
autotune.loadgen.bench_stats), which no log axis can place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_main import run_main
from support.studies import config

from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.level import LevelMetrics
from autotune.report import dashboard, plots
from autotune.store import Store
from autotune.tuning.measure import virtual_runner
from autotune.tuning.measure.outcome import LevelOutcome
from autotune.tuning.measure.virtual_runner import VirtualRunner
from autotune.workload.core import Workload

NAME = "t"


def _nothing_completed(n: int) -> LevelMetrics:
    """A level whose worker died before any of its ``n`` requests completed."""
    died = [
        RequestRecord(f"r{i}", error="connection: the worker died", sent_at=0.0, finished_at=0.1)
        for i in range(n)
    ]
    return LevelMetrics.from_summary(summarize(died, 1.0))


@pytest.fixture
def dead_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sim-virtual baseline (trial-0000) measures nothing: every level as above."""
    start, run_level = VirtualRunner.start, VirtualRunner.run_level

    async def started(self: VirtualRunner, engine_args: Any, trial_name: str) -> Any:
        self.trial_name = trial_name  # type: ignore[attr-defined]
        return await start(self, engine_args, trial_name)

    async def level(self: VirtualRunner, wl: Workload, scale: float, progress: Any = None) -> Any:
        out: LevelOutcome = await run_level(self, wl, scale, progress)
        if getattr(self, "trial_name", "") == "trial-0000":
            out.metrics = _nothing_completed(len(wl.requests))
        return out

    monkeypatch.setattr(VirtualRunner, "start", started)
    monkeypatch.setattr(VirtualRunner, "run_level", level)
    # the dashboard's plots are written after runs of at least 20 s; this one takes ~2 s
    monkeypatch.setattr(dashboard, "PLOTS_AFTER_RUN_S", 0.0)
    assert virtual_runner.VirtualRunner is VirtualRunner


@pytest.fixture
def study_yaml(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    _, text = config(
        workload={"num_prompts": 40},
        strategy={
            "n_trials": 3,
            "trials_per_stage": 1,
            "joint_refinement": 0,
            "validate": {"enabled": False},
        },
    )
    path = tmp_path / "study.yaml"
    path.write_text(text)
    yield path, f"sqlite:///{tmp_path / 'a.db'}"


def test_a_baseline_that_measured_nothing_finishes_with_exit_0_and_its_report_renders(
    dead_baseline: None,
    study_yaml: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, url = study_yaml
    code, out, err = run_main(
        ["study", "create", "--config", str(path), "--storage", url, "--run"], capsys
    )
    assert code == 0, err
    assert "Traceback" not in err and "warning" not in err.lower(), err
    with Store.open(url) as store:
        base = store.trials(NAME)[0]
    assert base.stage == "baseline" and base.feasible is False
    assert all(lv.output_throughput == 0.0 and lv.p99_ttft_ms == 0.0 for lv in base.levels)
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    code, out, err = run_main(
        ["report", NAME, "--storage", url, "--html", str(html), "--md", str(md)], capsys
    )
    assert code == 0 and err == "", err
    text = html.read_text()
    assert text.count("Plotly.newPlot") == len(plots.PLOT_IDS)
    # the baseline is named where it is left off the log axes, not dropped silently
    assert "not on the log axis (0 ms or NaN: nothing completed): trial 0" in text
    assert "wrote" in out and md.exists()


def _broken_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(view: Any) -> Any:
        raise RuntimeError("the renderer broke")

    monkeypatch.setattr(plots, "figures", broken)
    monkeypatch.setattr(dashboard, "PLOTS_AFTER_RUN_S", 0.0)


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


def test_a_failing_dashboard_refresh_is_one_warning_and_the_run_exits_0(
    study_yaml: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    _broken_plots(monkeypatch)
    path, url = study_yaml
    code, out, err = run_main(
        ["study", "create", "--config", str(path), "--storage", url, "--run"], capsys
    )
    assert code == 0, err
    (line,) = _lines(err)
    assert "WARNING" in line and "the study's note and plots not written" in line, err
    assert "RuntimeError: the renderer broke" in line
    assert "3 trial(s) run (plan complete)" in out


def test_the_nightly_records_its_decision_even_when_rendering_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from support.nightly import write_config, write_trace

    from autotune.errors import ConfigError
    from autotune.nightly import job
    from autotune.nightly.job_records import decisions

    def unwritable(path: Any, rec: Any) -> Path:
        raise ConfigError(f"output: cannot write {path} (Read-only file system)")

    _broken_plots(monkeypatch)
    monkeypatch.setattr(job, "write_output", unwritable)
    write_trace(tmp_path / "traces" / "day1.jsonl", prompt=700, seed=1, mtime=1_000_000)
    cfg = write_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'n.db'}"
    args = ["nightly", "--config", str(cfg), "--storage", url, "--at", "2026-12-01T02:00"]
    code, out, err = run_main(args, capsys)
    with Store.open(url) as store:
        (d,) = decisions(store, "chat")
    # the decision stands and is recorded: the exit status is its own (0 keep, 3 promote)
    assert code == d.exit_code and code in (0, 3), err
    assert d.study_name == "chat-20261201" and d.output_path == str(tmp_path / "out/chat.yaml")
    lines = _lines(err)
    assert len(lines) == 2 and all("WARNING" in ln for ln in lines), err
    assert "the study's note and plots not written" in lines[0]
    assert lines[1].endswith(
        "the decision is recorded, but the output file was not written: output: cannot "
        f"write {tmp_path / 'out/chat.yaml'} (Read-only file system)"
    )
    assert f"chat: {d.decision}" in out and "wrote" not in out
    assert not (tmp_path / "out" / "chat.yaml").exists()
    # run again the same day: the decision is emitted again, not made twice
    monkeypatch.undo()
    code, out, err = run_main(args, capsys)
    assert code == d.exit_code and err == "" and "  wrote " in out
    assert (tmp_path / "out" / "chat.yaml").exists()
    with Store.open(url) as store:
        assert len(decisions(store, "chat")) == 1
