"""The output file a deploy pipeline reads (docs/nightly.md#6-the-decision-and-the-output-file):
the config in use after a decision, as engine args YAML plus the ``vllm serve`` command."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.nightly.job_records import DecisionRecord
from autotune.redact import mask_command
from autotune.workers.vllm_command import deploy_argv, format_command

__all__ = ["serve_command", "write_output"]


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


def write_output(path: str | Path, rec: DecisionRecord) -> Path:
    """Write ``rec``'s deployed config atomically (a reader never sees half a file)."""
    p = Path(path)
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
    text = "# written by `autotune nightly` (docs/nightly.md)\n" + yaml.safe_dump(
        doc, sort_keys=False, allow_unicode=True, width=1000
    )
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except OSError as exc:
        raise ConfigError(f"output: cannot write {p} ({exc.strerror or exc})") from exc
    return p
