"""One bar for the baseline and the candidates (autotune/tuning/measure/verdict.py,
docs/tuning.md#7-validation): a config's run in the study counts as one of its runs, so a
baseline that broke its SLOs in the search is never kept on the strength of resamples; when
no config held in every run the verdict is "undecided" and `study best` recommends no
command; every "keep" says why. Pure verdicts on tiny inputs, then one scripted study through
run_validation, `study best` and its exit status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from support.runners import NoisyRunner
from support.studies import config
from typer.testing import CliRunner

from autotune.cli import app
from autotune.nightly.decide import decide
from autotune.store import LevelRecord, Store, StudyRecord, TrialRecord
from autotune.tuning.measure.interval import Run, ValidationSummary, summarize
from autotune.tuning.measure.validate import repeat_seeds, run_validation
from autotune.tuning.measure.verdict import held_in_study

CAP = ("slo-capacity", 0.95, 1.0)  # mode, confidence, sd floor (percent)


def _runs(**configs: Sequence[float | None]) -> list[Run]:
    """Runs of a complete plan: t0 the baseline; capacities per repeat (None: SLOs broken)."""
    return [
        Run(r, int(name[1:]), name == "t0", x is not None, x, 0.0, 100)
        for name, xs in configs.items()
        for r, x in enumerate(xs)
    ]


def _summary(runs: list[Run], study: Mapping[int, bool] | None = None) -> ValidationSummary:
    mode, conf, floor = CAP
    return summarize(
        runs,
        mode=mode,
        baseline_trial=0,
        repeats=max(r.repeat for r in runs) + 1,
        runs_planned=len(runs),
        confidence=conf,
        sd_floor=floor,
        max_overlength_rate=0.01,
        study_held=study,
    )


def test_a_baseline_that_broke_its_slos_in_the_study_is_never_kept() -> None:
    # the search measured the baseline infeasible; its resamples mostly pass; the candidate
    # gains nothing beyond noise. This used to say "keep": the baseline had to hold in one
    # repeat, a candidate in every one, and the candidate's interval spans 0.
    runs = _runs(t0=[1.0, None, 1.0], t1=[1.01, 0.99, 1.0])
    s = _summary(runs, {0: False, 1: True})
    assert (s.verdict, s.chosen) == ("no-baseline", 1)
    assert s.reason is not None
    assert "the current config breaks the SLOs: it held them only in 2 of 4 runs" in s.reason
    assert "(its run in the study failed)" in s.reason
    # even when it passed every resample: its study run is one of its runs
    all_pass = _summary(_runs(t0=[1.0, 1.0, 1.0], t1=[1.01, 0.99, 1.0]), {0: False, 1: True})
    assert (all_pass.verdict, all_pass.chosen) == ("no-baseline", 1)
    assert not all_pass.baseline_ok


def test_when_no_config_holds_every_run_the_verdict_is_undecided() -> None:
    # a noisy server: the baseline failed in the study then passed every repeat; the best
    # candidate failed one repeat by a hair
    runs = _runs(t0=[1.0, 1.0, 1.0], t1=[1.2, None, 1.2], t2=[1.1, 1.1, None])
    s = _summary(runs, {0: False, 1: True, 2: True})
    assert (s.verdict, s.chosen) == ("undecided", None)
    assert s.reason is not None and "keep" not in s.reason
    for part in (
        "no config held the SLOs in every run",
        "the baseline held them only in 3 of 4 runs (its run in the study failed)",
        "trial 1 held them only in 3 of 4 runs",
        "trial 2 held them only in 3 of 4 runs",
        "strategy.validate.repeats",
    ):
        assert part in s.reason, part
    assert s.candidate(1).figure_range == (1.2, 1.2) and s.baseline_figure_range == (1.0, 1.0)


def test_the_nightly_job_replaces_an_incumbent_that_broke_its_slos_in_the_study() -> None:
    # today's study measured the incumbent infeasible; it passed every repeat; the challenger
    # gains nothing: "incumbent infeasible", not "within noise"
    s = _summary(_runs(t0=[1.0, 1.0, 1.0], t1=[1.01, 0.99, 1.0]), {0: False, 1: True})
    d = decide(s, [], min_gain_pct=1.0)
    assert d.kind == "promote" and not d.incumbent_feasible
    assert "its SLOs held in 3 of 4 runs (its run in the study failed)" in d.reason
    held = _summary(_runs(t0=[1.0, 1.0, 1.0], t1=[1.01, 0.99, 1.0]), {0: True, 1: True})
    assert decide(held, [], min_gain_pct=1.0).kind == "keep"


def test_a_kept_baseline_says_why_per_candidate() -> None:
    # the baseline held everywhere; trial 1 broke a repeat, trial 2 gains nothing
    s = _summary(_runs(t0=[1.0, 1.0, 1.0], t1=[1.3, None, 1.3], t2=[1.0, 1.01, 0.99]))
    assert (s.verdict, s.chosen) == ("keep", None)
    assert s.reason == (
        "trial 1 held the SLOs only in 2 of 3 runs; trial 2 does not beat it beyond noise"
    )
    only_noise = _summary(_runs(t0=[1.0, 1.0, 1.0], t1=[1.0, 1.01, 0.99]), {0: True, 1: True})
    assert only_noise.reason == "no candidate beats it beyond noise"


def test_a_keep_decided_by_the_over_length_limit_names_it() -> None:
    # trial 1's interval lies wholly above 0, but it cut 1.5 % of requests over its repeats
    runs = [
        Run(r.repeat, r.trial_number, r.baseline, r.slo_held, r.figure, 0.015, 100)
        if r.trial_number == 1
        else r
        for r in _runs(t0=[1.0, 1.0, 1.0], t1=[1.03, 1.04, 1.03])
    ]
    s = _summary(runs, {0: True, 1: True})
    c = s.candidate(1)
    assert c is not None and c.interval is not None and c.interval.low > 0
    assert (s.verdict, s.best) == ("keep", 1)
    assert s.reason == (
        "trial 1 cut 1.50 % of requests over its repeats (max_model_len; the limit is 1 %), "
        f"forgoing a paired gain of {c.interval.mean:+.1f} % (interval {c.interval.low:+.1f} … "
        f"{c.interval.high:+.1f} %); its concurrency at a larger max_model_len "
        "(search.max_model_len) may keep it"
    )


def test_when_every_config_cuts_too_many_requests_the_advice_is_max_model_len() -> None:
    # the baseline's max_model_len (the study sample's longest request) cuts 1.5 % of fresh
    # samples, as do the candidates': no config meets the limit, and repeats will not help
    runs = [
        Run(r.repeat, r.trial_number, r.baseline, r.slo_held, r.figure, 0.015, 100)
        for r in _runs(t0=[1.0, 1.0, 1.0], t1=[1.1, 1.1, 1.1])
    ]
    s = _summary(runs, {0: True, 1: True})
    assert (s.verdict, s.chosen) == ("undecided", None)
    assert s.reason is not None
    assert "the baseline cut 1.50 % of requests over its repeats" in s.reason
    assert "a larger max_model_len (search.max_model_len)" in s.reason
    assert "strategy.validate.repeats" not in s.reason


def test_the_study_run_counts_only_latency_and_error_slos() -> None:
    def trial(feasible: bool, names: list[str], failure: str | None = None) -> TrialRecord:
        lv = LevelRecord(0, 0.25, None, 1.0, 100, 0, 0, 0.0, None, None, None, 0.0, 0.0, None,
                         False, {}, violations=[{"name": n} for n in names])  # fmt: skip
        return TrialRecord(
            "t", 0, "baseline", "COMPLETE", {}, {}, None, None, "sim-virtual",
            feasible=feasible, levels=[lv], failure_class=failure,
        )  # fmt: skip

    assert held_in_study(trial(True, []))
    # the over-length limit is judged pooled over the repeats, not on the study's one sample
    assert held_in_study(trial(False, ["overlength_rate"]))
    assert not held_in_study(trial(False, ["overlength_rate", "p99_ttft"]))
    assert not held_in_study(trial(False, ["overlength_rate"], "OOM"))


class PerRepeat(NoisyRunner):
    """Each config's capacity per validation repeat, scripted (None: below the lattice)."""

    def __init__(self, cfg: Any, spec: Mapping[int, Sequence[float | None]]) -> None:
        super().__init__(0, {}, [])
        self.repeat = {repeat_seeds(cfg, r)[1]: r for r in range(cfg.validation_repeats)}
        self.script = spec

    def bind(self, seed: int) -> PerRepeat:
        self.seed = seed
        return self

    async def start(self, engine_args: Mapping[str, Any], trial_name: str) -> Any:
        self.key = int(engine_args["max_num_seqs"])
        self.noise = self.script[self.key][self.repeat[self.seed]] or 0.01
        return None


def _scripted_study(
    tmp_path: Path, spec: Mapping[int, Sequence[float | None]], baseline_feasible: bool
) -> str:
    cfg, text = config(strategy={"capacity_levels": 24, "validate": {"top_k": 1, "repeats": 3}})
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Store.open(url) as store:
        store.create_study(StudyRecord("t", text, {}, cfg.mode, "sim-virtual", "t"))
        for n, obj in ((0, 100.0), (1, 110.0)):
            store.add_trial(
                TrialRecord(
                    "t", n, "baseline" if n == 0 else "joint", "COMPLETE", {},
                    {"max_num_seqs": n}, None, None, "sim-virtual", objective=obj,
                    feasible=baseline_feasible or n != 0,
                )
            )  # fmt: skip
        runner = PerRepeat(cfg, spec)
        asyncio.run(run_validation(cfg, store, "t", make_runner=runner.bind, vocab_size=32000))
    return url


def test_study_best_recommends_no_command_when_undecided(tmp_path: Path) -> None:
    # the baseline broke the SLOs in the search, passed every resample; the candidate broke one
    url = _scripted_study(tmp_path, {0: [1.0, 1.0, 1.0], 1: [1.2, None, 1.2]}, False)
    cli = CliRunner()
    text = cli.invoke(app, ["study", "best", "t", "--storage", url])
    assert text.exit_code == 4, text.output
    assert "vllm serve" not in text.output and "keep your current config" not in text.output
    assert "undecided, no recommendation: no config held the SLOs in every run" in text.output
    assert "baseline, trial 0: the SLOs held in 3 of 4 runs (its run in the study failed)" in (
        text.output
    )
    out = cli.invoke(app, ["study", "best", "t", "--storage", url, "--json"])
    got = json.loads(out.output)
    assert out.exit_code == 4 and got["command"] is None and got["gain"]["verdict"] == "undecided"


def test_study_best_replaces_a_baseline_that_broke_its_slos(tmp_path: Path) -> None:
    url = _scripted_study(tmp_path, {0: [1.0, None, 1.0], 1: [1.01, 1.0, 1.0]}, False)
    res = CliRunner().invoke(app, ["study", "best", "t", "--storage", url])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("vllm serve") and "--max-num-seqs 1" in res.output
    assert "validated: the current config breaks the SLOs" in res.output
