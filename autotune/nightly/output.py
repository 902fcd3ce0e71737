"""The output file a deploy pipeline reads (docs/nightly.md#6-the-decision-and-the-output-file):
the config in use after a decision, as engine args YAML plus the ``vllm serve`` command; and
the same document as the decision's commit in the git record (docs/git-record.md)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.gitrecord.commit_spec import RecordCommit, launch_script
from autotune.nightly.job_records import DecisionRecord
from autotune.redact import mask_command
from autotune.workers.vllm_command import deploy_argv, format_command

__all__ = ["decision_commit", "output_text", "serve_command", "write_output"]


def serve_command(
    model: str,
    engine_args: Mapping[str, Any],
    static_args: Mapping[str, Any] | None = None,
    served_name: str | None = None,
) -> str:
    """``vllm serve MODEL --flags...`` for ``engine_args`` (host and port left to the
    deployment, sim-only flags dropped)."""
    argv = deploy_argv(model, engine_args, static_args=static_args, served_model_name=served_name)
    return mask_command(format_command(argv))


def output_text(rec: DecisionRecord) -> str:
    """The output file's text: ``rec``'s decision and the config in use after it."""
    doc = {
        "deployment": rec.deployment,
        "decided_at": rec.created_at.isoformat(),
        "decision": rec.decision,
        "reason": rec.reason,
        "study": rec.study_name,
        "model": rec.model,
        "engine_args": dict(rec.deployed),
        "vllm_serve": rec.command,
    }
    return "# written by `autotune nightly` (docs/nightly.md)\n" + yaml.safe_dump(
        doc, sort_keys=False, allow_unicode=True, width=1000
    )


def write_output(path: str | Path, rec: DecisionRecord) -> Path:
    """Write ``rec``'s deployed config atomically (a reader never sees half a file)."""
    p = Path(path)
    text = output_text(rec)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except OSError as exc:
        raise ConfigError(f"output: cannot write {p} ({exc.strerror or exc})") from exc
    return p


def _changes(rec: DecisionRecord) -> str:
    """``max_num_seqs 128 -> 96``: the engine args the decision changed, or ""."""
    keys = [*rec.deployed, *(k for k in rec.incumbent if k not in rec.deployed)]
    moved = [
        f"{k} {rec.incumbent.get(k)} -> {rec.deployed.get(k)}"
        for k in keys
        if rec.incumbent.get(k) != rec.deployed.get(k)
    ]
    return ", ".join(moved)


def decision_commit(rec: DecisionRecord) -> RecordCommit:
    """The decision's commit in the git record (docs/git-record.md#4-nightly-decisions):
    ``nightly/DEPLOYMENT.yaml``, the output file's document, and ``nightly/DEPLOYMENT.sh``,
    the config in use as a script; the message says the decision, what it changed and the
    gain with its interval."""
    name = f"nightly/{rec.deployment}"
    files = {f"{name}.yaml": output_text(rec)}
    executable: frozenset[str] = frozenset()
    if rec.command:
        note = f"autotune nightly, deployment {rec.deployment}: the config in use ({name}.yaml)"
        files[f"{name}.sh"] = launch_script(shlex.split(rec.command), note)
        executable = frozenset({f"{name}.sh"})
    subject = f"nightly {rec.deployment} {rec.created_at:%Y-%m-%d}: {rec.decision}"
    changed = _changes(rec)
    subject += f" ({changed})" if changed else ""
    if rec.gain_pct is not None:
        subject += f", gain {rec.gain_pct:+.1f} %"
        if rec.gain_low is not None and rec.gain_high is not None:
            conf = 100 * (rec.confidence or 0.95)
            subject += f" ({conf:.0f} % CI {rec.gain_low:+.1f} … {rec.gain_high:+.1f} %)"
    body = [f"reason: {rec.reason}", f"study: {rec.study_name or '-'}"]
    body += [rec.command] if rec.command else []
    return RecordCommit(files, subject + "\n\n" + "\n".join(body), executable)
