"""What one commit of the git record holds (pure; docs/git-record.md#2-commits): its files
and message, built from stored records by :mod:`.trial_commit` and :mod:`.study_commit` (and
the nightly job's decision), written and committed by :mod:`.git_runner`. A trial's commit
names its study and trial in two trailers, which is how a later run knows it is committed."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "STUDY_TRAILER",
    "TRIAL_TRAILER",
    "RecordCommit",
    "launch_script",
    "recorded_trials",
    "trial_trailers",
]

STUDY_TRAILER = "Autotune-Study"
TRIAL_TRAILER = "Autotune-Trial"
_STUDY = re.compile(rf"^{STUDY_TRAILER}: (.+)$", re.M)
_TRIAL = re.compile(rf"^{TRIAL_TRAILER}: (\d+)$", re.M)


@dataclass(frozen=True)
class RecordCommit:
    """One commit: ``files`` maps a path relative to the record's folder (``launch.sh``,
    ``recommended/engine_args.yaml``) to its text, ``executable`` names the scripts among
    them, ``message`` is the whole commit message (subject, body, trailers)."""

    files: Mapping[str, str]
    message: str
    executable: frozenset[str] = field(default_factory=frozenset)


def trial_trailers(study: str, number: int) -> str:
    """The trailers that mark a trial's commit: its study and its (Optuna) number."""
    return f"{STUDY_TRAILER}: {study}\n{TRIAL_TRAILER}: {number}"


def recorded_trials(messages: Iterable[str]) -> set[tuple[str, int]]:
    """(study, trial) of every trial commit among ``messages`` (commit messages, whole)."""
    out: set[tuple[str, int]] = set()
    for msg in messages:
        study, trial = _STUDY.findall(msg), _TRIAL.findall(msg)
        if study and trial:  # the last paragraph's: a message quoting another comes first
            out.add((study[-1].strip(), int(trial[-1])))
    return out


def launch_script(argv: Sequence[str], comment: str) -> str:
    """A runnable ``sh`` script of ``argv`` (already masked), one flag and its values per
    line, so that a diff between two commits shows the one flag that changed; ``"$@"`` passes
    the deployment's own flags (``--host``, ``--port``) through."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        if arg.startswith("--") and i > 0:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    body = " \\\n  ".join(" ".join(words) for words in lines)
    head = "".join(f"# {ln}\n" if ln else "#\n" for ln in comment.splitlines())
    return f'#!/bin/sh\n{head}exec {body} \\\n  "$@"\n'
