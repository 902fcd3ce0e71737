"""``study export --format requests-jsonl | llmd-report``: one stored level, or every level of
a trial, as its per-request records or as llm-d benchmark reports
(docs/report.md#8-per-request-exports).

Which level: ``--trial N`` (default: the recommended trial, as ``study best`` names it) and
``--level K`` (the level's index; default: that trial's capacity level, the one ``study show``
reports; ``all``: every level, one file each in the ``--out`` folder).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.config import StudyConfig
from autotune.errors import ConfigError, NotFoundError
from autotune.loadgen.bench_stats import RequestRecord
from autotune.loadgen.request_log import FORMAT as REQUESTS_JSONL
from autotune.loadgen.request_log import decode_requests, parse_requests
from autotune.report.llmd_report import llmd_report
from autotune.report.recommend import recommend
from autotune.store import LevelRecord, Store, StudyRecord, TrialRecord
from autotune.tuning.run.create import load_study_config
from autotune.tuning.study_attrs import stored_noise

__all__ = ["LLMD_REPORT", "REQUEST_FORMATS", "ExportFile", "request_exports", "write_exports"]

LLMD_REPORT = "llmd-report"
REQUEST_FORMATS = (REQUESTS_JSONL, LLMD_REPORT)
ALL_LEVELS = "all"
# how to keep the records, in the one line that says a study kept none
_TURN_ON = (
    "set `record: {requests: true}` in the study's config and run a study with it "
    "(docs/loadgen.md#6-per-request-records)"
)


@dataclass(frozen=True)
class ExportFile:
    """One exported document: its file name inside an ``--out`` folder and its text."""

    name: str
    text: str


def _level_arg(level: str | None) -> int | str | None:
    if level is None or level == ALL_LEVELS:
        return level
    try:
        k = int(level)
    except ValueError:
        k = -1
    if k < 0:
        raise ConfigError(f"--level must be a level's index (0, 1, ...) or all, not {level!r}")
    return k


def _trial(
    store: Store, study: StudyRecord, cfg: StudyConfig, trials: list[TrialRecord], n: int | None
) -> TrialRecord:
    if n is None:
        rec = recommend(cfg, trials, store.repeats(study.name), stored_noise(store, study.name))
        if rec is None or rec.undecided:
            raise NotFoundError(
                f"study {study.name!r} recommends no trial; name one with --trial N "
                "(`autotune study show` lists them)"
            )
        return rec.trial
    found = next((t for t in trials if t.optuna_trial_number == n), None)
    if found is None:
        numbers = ", ".join(str(t.optuna_trial_number) for t in trials) or "none"
        raise ConfigError(f"--trial: study {study.name!r} has no trial {n} (its trials: {numbers})")
    return found


def _levels(trial: TrialRecord, level: int | str | None) -> list[LevelRecord]:
    n = trial.optuna_trial_number
    if level == ALL_LEVELS:
        chosen = list(trial.levels)
    elif level is None:
        top = trial.headline_level()
        chosen = [] if top is None else [top]
    else:
        chosen = [lv for lv in trial.levels if lv.level_index == level]
        if not chosen and trial.levels:
            have = ", ".join(str(lv.level_index) for lv in trial.levels)
            raise ConfigError(f"--level: trial {n} has no level {level} (its levels: {have})")
    if not chosen:
        raise NotFoundError(f"trial {n} measured no load level: nothing to export")
    return chosen


def _records(store: Store, lv: LevelRecord) -> str | None:
    """The level's requests-jsonl text, None when it kept none."""
    log = store.level_requests(lv.id) if lv.id is not None else None
    return None if log is None else decode_requests(log.data)


def _no_records(cfg: StudyConfig, study: str, trial: TrialRecord, lv: LevelRecord) -> str:
    where = f"trial {trial.optuna_trial_number} level {lv.level_index}"
    if not cfg.record.requests:
        return f"study {study!r} kept no per-request records (record.requests is off); {_TURN_ON}"
    return (
        f"{where} of study {study!r} has no per-request records stored, though the study "
        "keeps them; export another level or trial (--level, --trial)"
    )


def request_exports(
    store: Store, name: str, fmt: str, *, trial: int | None = None, level: str | None = None
) -> list[ExportFile]:
    """The chosen levels of study ``name`` in ``fmt`` (:data:`REQUEST_FORMATS`), one file
    each. requests-jsonl needs the records the study kept (one line says how to keep them);
    an llm-d report uses them when kept, else the level's stored figures."""
    which = _level_arg(level)
    study = store.get_study(name)
    if study is None:
        raise NotFoundError(f"no study named {name!r}; `autotune study list` shows the studies")
    cfg = load_study_config(study)
    chosen = _trial(store, study, cfg, store.trials(name), trial)
    out: list[ExportFile] = []
    for lv in _levels(chosen, which):
        text = _records(store, lv)
        stem = f"trial-{chosen.optuna_trial_number}-level-{lv.level_index}"
        if fmt == REQUESTS_JSONL:
            if text is None:
                raise NotFoundError(_no_records(cfg, name, chosen, lv))
            out.append(ExportFile(f"{stem}.jsonl", text))
            continue
        source = f"<records of {stem}>"
        records: Sequence[RequestRecord] | None = (
            None if text is None else parse_requests(text, source)
        )
        doc = llmd_report(study, cfg, chosen, lv, records)
        out.append(ExportFile(f"{stem}.json", json.dumps(doc, indent=1) + "\n"))
    return out


def _write(path: Path, text: str) -> None:
    data = text.encode("utf-8")
    try:
        # a .gz name gets the text gzip-compressed, as the store keeps it
        path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror})") from exc


def write_exports(files: Sequence[ExportFile], output: Path | None) -> None:
    """One document to ``output`` (stdout when None); several (``--level all``) into the
    folder ``output``, created when missing, one file each."""
    if len(files) == 1:
        if output is None:
            sys.stdout.write(files[0].text)
        else:
            _write(output, files[0].text)
        return
    if output is None:
        raise ConfigError("--level all writes one file per level: give --out FOLDER")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{output}: cannot create the folder ({exc.strerror})") from exc
    for f in files:
        _write(output / f.name, f.text)
