"""The commits that follow a study's trials in the git record (pure; docs/git-record.md):
the validation's verdict and figures once the validation phase is complete, and the
recommendation as ``study best`` prints it, with its command as a script and its engine
args as YAML. Both are written in the report's words (:mod:`autotune.report.best_output`)."""

from __future__ import annotations

import shlex

import yaml

from autotune.gitrecord.commit_spec import RecordCommit, launch_script
from autotune.report.best_output import format_recommendation, format_validation, validation_block
from autotune.report.recommend import Recommendation

__all__ = [
    "RECOMMENDED",
    "VALIDATION",
    "recommendation_commit",
    "study_commits",
    "validation_commit",
]

VALIDATION = "validation.txt"
RECOMMENDED = "recommended"  # the folder of the recommended config's files
_SCRIPT = f"{RECOMMENDED}/launch.sh"
_NOTE = (
    "autotune's git record (docs/git-record.md): the recommended `vllm serve` command of\n"
    "the study named in this commit's message ({summary}). Host and port are the\n"
    "deployment's: pass them as arguments (./launch.sh --port 8000)."
)


def validation_commit(study: str, rec: Recommendation) -> RecordCommit | None:
    """The validation's verdict with each re-measured config's validated figures (the lines
    ``study best`` prints); None before the validation phase is complete."""
    if not rec.validated:
        return None
    lines = format_validation(rec) + validation_block(rec)
    text = f"# Validation of study {study}\n\n" + "\n".join(lines) + "\n"
    subject = f"validation of study {study}: {lines[0].strip()}"
    return RecordCommit({VALIDATION: text}, subject + "\n\n" + "\n".join(lines[1:]).strip())


def _subject(study: str, rec: Recommendation) -> str:
    if rec.undecided:
        return f"recommendation of study {study}: none (undecided, no config held its SLOs)"
    t = rec.trial
    cap = rec.capacity()
    at = f" at {cap.scale_text()}" if cap is not None and cap.scale is not None else ""
    fig = (
        f"{t.objective:,.0f} tok/s{at}"
        if t.feasible and t.objective is not None
        else "infeasible in the study"
    )
    what = "keep the baseline, " if rec.keep else ""
    state = "validated" if rec.validated else "not validated"
    return (
        f"recommendation of study {study}: {what}trial {t.optuna_trial_number} [{t.stage}], "
        f"{fig}, {state}"
    )


def recommendation_commit(study: str, rec: Recommendation) -> RecordCommit:
    """The recommendation: ``recommended/summary.txt`` (``study best``'s text) and, when a
    config is recommended, its ``launch.sh`` and ``engine_args.yaml``."""
    summary = format_recommendation(rec)
    files = {f"{RECOMMENDED}/summary.txt": summary + "\n"}
    executable: frozenset[str] = frozenset()
    if not rec.undecided:  # no command to run when no config held its SLOs in every run
        argv = rec.argv if rec.argv is not None else shlex.split(rec.command)
        note = _NOTE.format(summary=f"{RECOMMENDED}/summary.txt")
        files[_SCRIPT] = launch_script(argv, note)
        files[f"{RECOMMENDED}/engine_args.yaml"] = yaml.safe_dump(rec.engine_args, sort_keys=False)
        executable = frozenset({_SCRIPT})
    body = rec.command if not rec.undecided else summary.splitlines()[0]
    return RecordCommit(files, _subject(study, rec) + "\n\n" + body, executable)


def study_commits(study: str, rec: Recommendation | None) -> list[RecordCommit]:
    """What a run's end commits after the trials, in order: the validation (once complete),
    then the recommendation (none without a feasible trial)."""
    if rec is None:
        return []
    done = validation_commit(study, rec)
    return ([done] if done is not None else []) + [recommendation_commit(study, rec)]
