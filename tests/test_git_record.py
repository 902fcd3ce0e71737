"""The git record (docs/git-record.md): with ``record.git`` a study run commits each trial's
command, engine args, levels and result, in trial order, then the validation and the
recommendation; `study export NAME --git DIR` makes the same commits from the store; the
nightly job commits its decision. A user's own files in the repository are never touched,
and a repository that cannot take a commit costs one warning, never the study.

One small sim-virtual study (three trials, validated) is run once, through the command line,
into a folder of a repository that already has the user's work in progress in it.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.nightly import write_config, write_trace
from support.studies import config

from autotune import cli
from autotune.config import StudyConfig
from autotune.gitrecord import git_runner
from autotune.gitrecord.commit_spec import (
    RecordCommit,
    launch_script,
    recorded_trials,
    trial_trailers,
)
from autotune.gitrecord.git_runner import open_folder
from autotune.gitrecord.run_hooks import HOOKS
from autotune.gitrecord.study_record import commit_one, commit_study, record_run
from autotune.gitrecord.trial_commit import TRIAL_FILES
from autotune.nightly.job import run_nightly
from autotune.nightly.job_config import load_nightly_config
from autotune.store import Store, TrialRecord
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study

NAME = "g"
REC = "tuning/rec"  # the record's folder inside the user's repository
STRATEGY = {
    "name": "staged",
    "trials_per_stage": 1,
    "joint_refinement": 1,
    "n_trials": 3,
    "capacity_levels": 4,
    "validate": {"top_k": 1, "repeats": 2},
}
_ID = ["-c", "user.name=someone", "-c", "user.email=someone@example.com"]


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout


def _study(folder: Path | None, **strategy: Any) -> tuple[StudyConfig, str]:
    over: dict[str, Any] = {
        "name": NAME,
        "workload": {"num_prompts": 60},
        # a few long prompts of the small fresh samples must not leave validation undecided
        "slo": {"max_overlength_rate": 0.05},
        "strategy": {**STRATEGY, **strategy},
    }
    if folder is not None:
        over["record"] = {"git": str(folder)}
    return config(**over)


def _cli(args: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code in (0, None)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The user's repository (with a staged and a modified file, and an untracked one) after
    `autotune study create --run` of a study whose record.git is a folder in it; and the
    study's database URL."""
    root = tmp_path_factory.mktemp("gitrecord")
    work = root / "work"
    work.mkdir()
    git(work, "init", "--quiet")
    (work / "notes.txt").write_text("v1\n")
    git(work, "add", "notes.txt")
    git(work, *_ID, "commit", "--quiet", "-m", "the user's work")
    (work / "notes.txt").write_text("v2 staged\n")
    git(work, "add", "notes.txt")
    (work / "notes.txt").write_text("v3 in the work tree\n")
    (work / "draft.txt").write_text("untracked\n")
    _, text = _study(work / REC)
    path = root / "study.yaml"
    path.write_text(text)
    url = f"sqlite:///{root / 's.db'}"
    _cli(["study", "create", "--config", str(path), "--storage", url, "--run"])
    return work, url


def _trials(url: str) -> list[TrialRecord]:
    with Store.open(url) as store:
        return sorted(store.trials(NAME), key=lambda t: t.optuna_trial_number)


def _commits(repo: Path, folder: str = ".") -> list[str]:
    """The commits that changed ``folder``, oldest first."""
    return git(repo, "log", "--reverse", "--format=%H", "--", folder).split()


def test_launch_script_and_trailers_round_trip() -> None:
    argv = ["vllm", "serve", "m/x y", "--max-num-seqs", "8", "--served-model-name", "a", "b"]
    script = launch_script(argv, "one\ntwo")
    lines = script.splitlines()
    assert lines[:3] == ["#!/bin/sh", "# one", "# two"]
    # one flag and its values per line, quoted as a shell reads them back
    assert "  --max-num-seqs 8 \\" in lines and "  --served-model-name a b \\" in lines
    words = shlex.split(script.split("exec ", 1)[1].replace("\\\n", " "))
    assert words == [*argv, "$@"]
    msgs = ["trial 3 [x]: ...\n\nbody\n\n" + trial_trailers("s 1", 3), "recommendation", "x"]
    assert recorded_trials(msgs) == {("s 1", 3)}


@pytest.mark.config_field("record.git")
def test_each_trial_is_one_commit_in_trial_order_then_validation_and_recommendation(
    recorded: tuple[Path, str],
) -> None:
    work, url = recorded
    trials = _trials(url)
    assert [t.optuna_trial_number for t in trials] == [0, 1, 2]
    assert {t.state for t in trials} <= {"COMPLETE", "PRUNED"}
    commits = _commits(work, REC)
    subjects = [git(work, "log", "-1", "--format=%s", c).strip() for c in commits]
    assert len(commits) == len(trials) + 2, subjects
    for t, c, subject in zip(trials, commits, subjects, strict=False):
        n = t.optuna_trial_number
        assert subject.startswith(f"trial {n} [{t.stage}]: "), subject
        if t.state == "PRUNED":  # settled below the best capacity so far
            assert t.settled_below is not None
            assert subject.endswith(
                f"settled, capacity < x{t.settled_below:.3f} (settled "
                f"against trial {t.settled_against})"
            ), subject
        else:
            assert t.feasible and t.objective is not None and t.capacity_scale is not None
            assert f": {t.objective:,.0f} tok/s at " in subject and subject.endswith(", feasible")
            assert f"x{t.capacity_scale:.3f}" in subject
        body = git(work, "log", "-1", "--format=%B", c)
        assert body.rstrip().endswith(f"Autotune-Study: {NAME}\nAutotune-Trial: {n}")
        names = git(work, "show", "--name-only", "--format=", c).split()
        assert sorted(names) == sorted(f"{REC}/{f}" for f in TRIAL_FILES)
        # the command runs the trial's engine args, one flag a line, and is executable
        script = git(work, "show", f"{c}:{REC}/launch.sh")
        assert git(work, "ls-tree", c, f"{REC}/launch.sh").startswith("100755 ")
        flags = shlex.split(script.split("exec ", 1)[1].replace("\\\n", " "))
        assert flags[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
        assert flags[flags.index("--max-num-seqs") + 1] == str(t.engine_args["max_num_seqs"])
        assert yaml.safe_load(git(work, "show", f"{c}:{REC}/engine_args.yaml")) == t.engine_args
        # every level a row; the result in vllm bench serve's names, of the headline level
        table = git(work, "show", f"{c}:{REC}/levels.md")
        assert sum(ln.startswith("| x") for ln in table.splitlines()) == len(t.levels)
        result = json.loads(git(work, "show", f"{c}:{REC}/result.json"))
        top = t.headline_level()
        assert top is not None
        assert result["output_throughput"] == pytest.approx(top.output_throughput, abs=1e-3)
        assert result["completed"] == top.completed
        for key in ("duration", "request_throughput", "mean_ttft_ms", "median_tpot_ms"):
            assert isinstance(result[key], float), key
        assert {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"} <= result.keys()
        assert result["autotune"]["trial"] == n and result["autotune"]["stage"] == t.stage
    assert subjects[-2].startswith(f"validation of study {NAME}: ")
    assert subjects[-1].startswith(f"recommendation of study {NAME}: ")
    assert f"{REC}/validation.txt" in git(work, "show", "--name-only", "--format=", commits[-2])
    assert "recommended/summary.txt" in git(work, "show", "--name-only", "--format=", commits[-1])
    # a diff between two trials shows the flag that changed and nothing else of the command
    d = git(work, "diff", commits[0], commits[2], "--", f"{REC}/launch.sh")
    changed = [ln for ln in d.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert changed and all(ln[1:].strip().startswith("--") for ln in changed), d


def test_the_users_staged_modified_and_untracked_files_are_left_alone(
    recorded: tuple[Path, str],
) -> None:
    work, _ = recorded
    status = git(work, "status", "--porcelain").splitlines()
    assert sorted(status) == ["?? draft.txt", "MM notes.txt"], status
    assert git(work, "show", ":notes.txt") == "v2 staged\n"  # still staged, not committed
    assert (work / "notes.txt").read_text() == "v3 in the work tree\n"
    assert git(work, "show", "HEAD:notes.txt") == "v1\n"
    first = _commits(work)[0]
    touched = git(work, "log", "--format=", "--name-only", f"{first}..HEAD").split()
    assert touched and all(p.startswith(f"{REC}/") for p in touched), touched
    # the repository's own identity is used: it has one (the user's global or none: autotune)
    assert git(work, "log", "-1", "--format=%ae").strip()


def test_export_to_git_makes_the_same_commits_and_then_none(
    recorded: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work, url = recorded
    out = tmp_path / "exported"  # in no repository: one is initialised there
    _cli(["study", "export", NAME, "--storage", url, "--git", str(out)])
    ours, theirs = _commits(work, REC), _commits(out)
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs, strict=True):
        assert git(work, "log", "-1", "--format=%B", a) == git(out, "log", "-1", "--format=%B", b)
        # the same files, byte for byte
        assert git(work, "rev-parse", f"{a}:{REC}") == git(out, "rev-parse", f"{b}^{{tree}}")
    assert "5 commit(s)" in capsys.readouterr().out
    _cli(["study", "export", NAME, "--storage", url, "--git", str(out)])
    assert "0 commit(s)" in capsys.readouterr().out and _commits(out) == theirs


def test_concurrent_committers_commit_each_trial_once_in_order(
    recorded: tuple[Path, str], tmp_path: Path
) -> None:
    _, url = recorded
    folder = tmp_path / "shared"
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            with Store.open(url) as store:
                cfg = _study(folder)[0]
                commit_study(cfg, store, folder, final=False)
        except BaseException as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    subjects = git(folder, "log", "--reverse", "--format=%s").splitlines()
    assert [s.split(" [")[0] for s in subjects] == ["trial 0", "trial 1", "trial 2"]


def _hook(work: Path) -> Path:
    git(work, "init", "--quiet")
    hook = work / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'refused by a hook' >&2\nexit 1\n")
    hook.chmod(0o755)
    return work / "rec"


def _under_a_file(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "plain").write_text("a file, not a folder\n")
    return work / "plain" / "rec"


@pytest.mark.parametrize("broken", ["hook", "under_a_file", "no_git"])
def test_a_repository_that_takes_no_commit_is_one_warning_and_the_study_finishes(
    broken: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    folder = _hook(work) if broken == "hook" else _under_a_file(work)
    if broken == "no_git":  # git is not installed
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    cfg, text = _study(folder, n_trials=2, validate={"enabled": False})
    caplog.set_level(logging.WARNING, logger="autotune")
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        create_study(cfg, text, store)
        report = run_study(NAME, store, hooks=HOOKS)
        assert report.trials_run == 2
        warned = [r for r in caplog.records if r.name.startswith("autotune.gitrecord")]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        assert "git record: not committed" in warned[0].getMessage()
        if broken != "hook":
            return
        assert "refused by a hook" in warned[0].getMessage()
        assert git(work, "status", "--porcelain", "--untracked-files=no") == ""  # index clean
        (work / ".git" / "hooks" / "pre-commit").unlink()
        record_run(cfg, store, True)  # the next call commits what is missing, in order
        store_trials = store.trials(NAME)
    subjects = git(work, "log", "--reverse", "--format=%s").splitlines()
    assert [s.split(" [")[0] for s in subjects[:2]] == ["trial 0", "trial 1"]
    assert subjects[2].startswith("recommendation of study") and len(subjects) == 3
    # not validated here: the study's best is recommended, its command a script
    best = yaml.safe_load((folder / "recommended" / "engine_args.yaml").read_text())
    assert best in [t.engine_args for t in store_trials]
    assert (folder / "recommended" / "launch.sh").stat().st_mode & 0o111


def test_a_nightly_decision_is_committed_with_the_config_in_use(tmp_path: Path) -> None:
    write_trace(tmp_path / "traces" / "day1.jsonl", prompt=700, seed=1, mtime=1_000_000, n=60)
    path = write_config(tmp_path)
    rec = tmp_path / "record"
    text = path.read_text().replace("n_trials: 5", "n_trials: 2")
    path.write_text(text + f"record:\n  git: {rec}\n")
    cfg = load_nightly_config(path)
    with Store.open(f"sqlite:///{tmp_path / 'n.db'}") as store:
        res = run_nightly(cfg, store, now=lambda: datetime(2026, 12, 1, 2, 0, tzinfo=UTC))
    d = res.decision
    subjects = git(rec, "log", "--format=%s").splitlines()
    assert subjects[0].startswith(f"nightly chat 2026-12-01: {d.decision}"), subjects
    # the dated study's trials were committed too, before the decision
    assert any(s.startswith("trial 0 [baseline]") for s in subjects[1:])
    # the decision's document is the output file the deploy pipeline reads
    assert (rec / "nightly" / "chat.yaml").read_text() == Path(cfg.output).read_text()
    script = (rec / "nightly" / "chat.sh").read_text()
    assert f"--max-model-len {d.deployed['max_model_len']} " in script


def test_a_repository_without_an_identity_commits_as_autotune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    folder = tmp_path / "rec"
    assert commit_one(folder, RecordCommit({"a.txt": "1\n"}, "first"))
    assert not commit_one(folder, RecordCommit({"a.txt": "1\n"}, "same content"))
    assert git(folder, "log", "--format=%an <%ae>|%s").splitlines() == [
        "autotune <autotune@localhost>|first"
    ]
    assert git(folder, "config", "--list", "--local").count("user.") == 0  # nothing configured


def test_a_run_without_the_hooks_says_it_records_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, text = _study(tmp_path / "rec", n_trials=1, validate={"enabled": False})
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        create_study(cfg, text, store)
        run_study(NAME, store)
    assert "it commits nothing" in caplog.text and not (tmp_path / "rec").exists()


def test_a_folder_another_committer_is_initialising_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of two `git init`s on one new folder fails on a file the first is making,
    and the repository reads back only once the first is done: the second waits for it."""
    real, seen = git_runner._git, {"init": 0, "late": 0}

    def racing(cwd: Path, args: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        if args[0] == "init" and seen["init"] == 0:
            seen["init"] += 1  # the other committer's init is under way: ours fails
            return subprocess.CompletedProcess(args, 1, "", "could not create .git: File exists")
        if args[0] == "rev-parse" and seen["init"] == 1 and seen["late"] == 0:
            seen["late"] += 1  # and its repository is not complete yet
            return subprocess.CompletedProcess(args, 128, "", "fatal: not a git repository")
        return real(cwd, args, **kw)

    monkeypatch.setattr(git_runner, "_git", racing)
    monkeypatch.setattr(git_runner.time, "sleep", lambda _s: None)
    folder = open_folder(tmp_path / "new")
    assert seen == {"init": 1, "late": 1}
    assert folder.top == (tmp_path / "new").absolute() and (folder.top / ".git").is_dir()
