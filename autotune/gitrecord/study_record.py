"""A study's git record (docs/git-record.md): what the store holds of a study and the
record's repository lacks, committed in trial order, then the validation and the
recommendation.

The repository itself says what is committed (each trial commit's trailers,
:mod:`.commit_spec`), so a record can be written during a run (``record.git``, after every
trial), after it (``autotune study export NAME --git DIR``), by several controllers into one
folder, or again after a commit failed: each time the missing commits are made, in order,
and nothing twice. During a run, a trial that another lane or controller is still running
holds the later ones back until its own commit; at a run's end every finished trial is
committed.

In a run, git's failures never cost the study: the first is one warning line, the later
ones are silent, and every later call tries the missing commits again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.config import StudyConfig
from autotune.errors import DatabaseLostError
from autotune.gitrecord.commit_spec import RecordCommit, recorded_trials
from autotune.gitrecord.git_runner import GitFolder, open_folder
from autotune.gitrecord.study_commit import study_commits
from autotune.gitrecord.trial_commit import trial_commit
from autotune.report.recommend import recommend
from autotune.store import Store
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.study_attrs import stored_noise

__all__ = ["RecordResult", "commit_one", "commit_study", "record_commit", "record_run"]

log = logging.getLogger(__name__)

_RECORDED_STATES = ("COMPLETE", "PRUNED")  # a verdict; FAIL is an attempt run again
# the folders whose failure was reported (once per process, again after a success)
_warned: set[Path] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class RecordResult:
    """What a call committed: ``commits`` made in the repository at ``top``, in its folder
    ``rel`` (``.``: the top itself)."""

    commits: int
    top: Path
    rel: str


def commit_study(
    cfg: StudyConfig, store: Store, folder: str | Path, *, final: bool = True
) -> RecordResult:
    """Commit study ``cfg.name``'s finished trials the repository of ``folder`` lacks, in
    trial order; with ``final`` (the end of a run, an export) every finished one, then the
    validation and the recommendation, else only up to the first trial still running.
    Raises :class:`~autotune.errors.ConfigError` when git fails."""
    repo = open_folder(folder)
    with repo.lock():
        made = _commit_trials(repo, cfg, store, final)
        if final:
            trials = store.trials(cfg.name)
            rec = recommend(cfg, trials, store.repeats(cfg.name), stored_noise(store, cfg.name))
            made += sum(repo.commit(c) for c in study_commits(cfg.name, rec))
    return RecordResult(made, repo.top, repo.rel)


def _commit_trials(repo: GitFolder, cfg: StudyConfig, store: Store, final: bool) -> int:
    done = {n for study, n in recorded_trials(repo.messages()) if study == cfg.name}
    todo: list[int] = []
    for t in sorted(store.trials(cfg.name, with_levels=False), key=lambda t: t.optuna_trial_number):
        if t.state == "RUNNING" and not final:
            break  # in trial order: the later ones follow this one's commit
        if t.state in _RECORDED_STATES and t.optuna_trial_number not in done:
            todo.append(t.optuna_trial_number)
    if not todo:
        return 0
    full = {t.optuna_trial_number: t for t in store.trials(cfg.name)}  # with their levels
    lattice = lattice_of(cfg)
    return sum(repo.commit(trial_commit(full[n], cfg, lattice)) for n in todo if n in full)


def commit_one(folder: str | Path, commit: RecordCommit) -> bool:
    """Commit ``commit`` in ``folder``'s repository (False: nothing had changed); raises
    :class:`~autotune.errors.ConfigError` when git fails."""
    repo = open_folder(folder)
    with repo.lock():
        return repo.commit(commit)


def _guarded(folder: str, write: Callable[[], object]) -> None:
    """``write()``; git's failure is one warning per folder (again only after a success),
    never the caller's; a lost database is the run's to report."""
    key = Path(folder).expanduser().absolute()
    try:
        write()
    except DatabaseLostError:
        raise
    except Exception as exc:
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        if first:
            line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning(
                "git record: not committed: %s; the study goes on, later commits are "
                "tried again silently (docs/git-record.md#3-safety)",
                line,
            )
        log.debug("git record: not committed", exc_info=True)
    else:
        with _warned_lock:
            _warned.discard(key)


def record_run(cfg: StudyConfig, store: Store, final: bool) -> None:
    """A run's git record (``RunHooks.record``) when the study's ``record.git`` is set;
    never raises for git."""
    folder = cfg.record.git
    if folder is not None:
        _guarded(folder, lambda: commit_study(cfg, store, folder, final=final))


def record_commit(folder: str, commit: RecordCommit) -> None:
    """One commit (a nightly decision) in ``folder``'s repository; never raises for git."""
    _guarded(folder, lambda: commit_one(folder, commit))
