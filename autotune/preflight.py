"""Checks ``study create`` runs before anything is launched or stored.

- ``worker.static_args`` and ``search.extra`` against ``vllm serve``'s flags
  (:mod:`autotune.profiles.flags`): unknown flags, values vLLM would refuse, and flags autotune
  sets itself each get one line naming the field. Problems that depend on the vLLM version
  are warnings when the worker's vLLM is another release than the shipped list's, or cannot
  be found.
- secrets written literally into the config (``api_key: sk-...``, ``HF_TOKEN: hf_...`` in
  ``worker.env``, a password inside ``telemetry.prometheus_url``) are refused: the config is
  stored with the study, so they must come from ``${VAR}``. A password in ``storage:`` is
  allowed (``study run`` never reads it) and masked in the stored copy
  (:func:`stored_config_text`).

:func:`check` raises one :class:`~autotune.errors.ConfigError` for the first problem, with
the count of the others, and returns the warnings. :func:`check_size` refuses a workload
whose estimated memory (:mod:`autotune.sizing`) exceeds the limit, unless allowed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from autotune import sizing
from autotune.config import SourceMap, StudyConfig, source_map
from autotune.errors import ConfigError
from autotune.profiles.flags import (
    FlagSpec,
    FlagTable,
    check_value,
    flag_key,
    flag_table,
    same_release,
    sim_flag,
    vllm_version_of,
)
from autotune.redact import is_secret_name, mask_text, url_has_password
from autotune.sim import hardware_of
from autotune.tuning.search.plan import model_of

__all__ = [
    "Problem",
    "check",
    "check_size",
    "flag_problems",
    "secret_problems",
    "stored_config_text",
]

Path_ = tuple[str | int, ...]

TUNED = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")
# flags autotune writes on every worker command line, and where the user sets them instead
_SET_BY_AUTOTUNE = {
    "model": "autotune passes model.name as the model",
    "host": "autotune sets it from worker.host",
    "port": "autotune gives every trial a free port",
    "served_model_name": "autotune sets it from model.served_name",
}


@dataclass(frozen=True)
class Problem:
    path: Path_
    message: str
    versioned: bool = False  # depends on the vLLM version: a warning on another release

    def line(self, smap: SourceMap) -> str:
        field = ".".join(str(p) for p in self.path)
        return f"{smap.where(self.path)}: {field}: {self.message}"


def _unknown(name: str, table: FlagTable) -> str:
    flags = sorted({s.flag for s in table.by_option.values()})
    guess = difflib.get_close_matches(
        "--" + flag_key(name).replace("_", "-"), flags, n=1, cutoff=0.8
    )
    hint = f"did you mean {guess[0][2:].replace('-', '_')}? " if guess else ""
    return f"not a flag of vllm serve {table.vllm_version} ({hint}see `vllm serve --help=all`)"


def _reserved(spec: FlagSpec, extras: set[str]) -> str | None:
    if spec.dest in _SET_BY_AUTOTUNE:
        return f"{spec.flag} is set by autotune ({_SET_BY_AUTOTUNE[spec.dest]})"
    if spec.dest in TUNED:
        return (
            f"{spec.flag} is tuned by autotune: narrow search.{spec.dest} instead "
            "(e.g. candidates: [value] or low/high)"
        )
    if spec.dest in extras:
        return f"{spec.flag} is tuned by autotune (it is in search.extra)"
    return None


def _static_problems(cfg: StudyConfig, table: FlagTable, extras: set[str]) -> list[Problem]:
    out: list[Problem] = []
    kind = cfg.worker.kind
    seen: dict[str, str] = {}
    for key, value in cfg.worker.static_args.items():
        path: Path_ = ("worker", "static_args", key)
        k = flag_key(key)
        sim = sim_flag(k)
        if sim is not None:
            if sim.set_by is not None and kind != "vllm":
                out.append(Problem(path, f"{sim.flag} is set by autotune ({sim.set_by})"))
            elif kind != "sim":
                out.append(
                    Problem(
                        path,
                        f"{sim.flag} is a flag of the "
                        "simulated server: only worker.kind 'sim' takes it",
                    )
                )
            continue
        head = k.split(".", 1)[0]
        spec = table.lookup(head)
        if spec is None:
            out.append(Problem(path, _unknown(k, table), versioned=True))
            continue
        if "." in k and spec.kind != "json":
            out.append(Problem(path, f"{spec.flag} is not a JSON flag: it has no fields"))
            continue
        reserved = _reserved(spec, extras)
        if reserved is not None:
            out.append(Problem(path, reserved))
            continue
        if spec.dest in seen and "." not in k:
            out.append(Problem(path, f"{spec.flag} is given twice (also as {seen[spec.dest]!r})"))
            continue
        seen[spec.dest] = key
        if "." not in k:
            problem = check_value(spec, value)
            if problem is not None:
                out.append(Problem(path, problem, versioned=True))
    return out


def _extra_problems(cfg: StudyConfig, table: FlagTable) -> list[Problem]:
    out: list[Problem] = []
    names: set[str] = set()
    for i, extra in enumerate(cfg.search.extra):
        path: Path_ = ("search", "extra", i, "name")
        spec = table.lookup(extra.name)
        if spec is None:
            out.append(Problem(path, _unknown(extra.name, table), versioned=True))
            continue
        if spec.dest in _SET_BY_AUTOTUNE or spec.dest in TUNED:
            why = _reserved(spec, set())
            out.append(Problem(path, f"{why}; it cannot be an extra parameter"))
            continue
        if spec.dest in names:
            out.append(Problem(path, f"{spec.flag} is in search.extra twice"))
            continue
        names.add(spec.dest)
        for j, choice in enumerate(extra.choices):
            problem = check_value(spec, choice)
            if problem is not None:
                out.append(Problem(("search", "extra", i, "choices", j), problem, versioned=True))
    return out


def _enqueue_problems(cfg: StudyConfig) -> list[Problem]:
    known = set(TUNED) | {e.name for e in cfg.search.extra}
    out: list[Problem] = []
    for i, entry in enumerate(cfg.enqueue):
        for name in entry:
            if name not in known:
                out.append(
                    Problem(
                        ("enqueue", i, name),
                        f"not a tuned parameter (known: {', '.join(sorted(known))})",
                    )
                )
    return out


def flag_problems(cfg: StudyConfig, table: FlagTable | None = None) -> list[Problem]:
    """Every problem of ``worker.static_args``, ``search.extra`` and ``enqueue`` against
    the list and the tuned parameters."""
    table = table or flag_table()
    extras = {s.dest for e in cfg.search.extra if (s := table.lookup(e.name)) is not None}
    return (
        _extra_problems(cfg, table) + _static_problems(cfg, table, extras) + _enqueue_problems(cfg)
    )


def secret_problems(cfg: StudyConfig, smap: SourceMap) -> list[Problem]:
    """Secrets written literally into the config (it is stored with the study)."""
    out: list[Problem] = []
    for key, value in cfg.worker.static_args.items():
        path: Path_ = ("worker", "static_args", key)
        if is_secret_name(key) and value not in (None, True, False) and not _from_env(smap, path):
            var = flag_key(key).upper()
            out.append(
                Problem(
                    path,
                    "a secret written into the config would be stored with the study: "
                    f"write it as ${{{var}}} and set {var} in the environment",
                )
            )
    for name in cfg.worker.env:
        path = ("worker", "env", name)
        if is_secret_name(name) and not _from_env(smap, path):
            out.append(
                Problem(
                    path,
                    "a secret written into the config would be stored with the study: "
                    f"write it as ${{{name}}} or list {name} in worker.env_passthrough",
                )
            )
    url = cfg.telemetry.prometheus_url
    path = ("telemetry", "prometheus_url")
    if url and url_has_password(url) and not _from_env(smap, path):
        out.append(
            Problem(
                path,
                "a password written into the config would be stored with the study: "
                "write the URL as ${PROMETHEUS_URL} and set it in the environment",
            )
        )
    return out


def _from_env(smap: SourceMap, path: Path_) -> bool:
    """Whether the value at ``path`` (or any part of it) came from ``${VAR}``."""
    return any(p[: len(path)] == path for p in smap.expanded)


def _worker_version(cfg: StudyConfig, table: FlagTable) -> tuple[str | None, str | None]:
    """(version, warning): the simulated workers are the list's version."""
    if cfg.worker.kind != "vllm":
        return table.vllm_version, None
    found = vllm_version_of(cfg.worker.vllm_executable)
    if found is None:
        return None, (
            f"cannot tell which vLLM worker.vllm_executable {cfg.worker.vllm_executable[0]!r} "
            f"runs; its flags are checked against vLLM {table.vllm_version}'s list, as warnings"
        )
    if not same_release(found, table.vllm_version):
        return found, (
            f"the worker runs vLLM {found}, and autotune's flag list is vLLM "
            f"{table.vllm_version}'s: flag problems below are warnings"
        )
    return found, None


def check(cfg: StudyConfig, text: str, source: str) -> list[str]:
    """Run every create-time check on a parsed config and its text; returns the warnings
    (one line each) and raises ConfigError naming the first error's file, line and field."""
    smap = source_map(text, source)
    table = flag_table()
    warnings: list[str] = []
    errors: list[Problem] = secret_problems(cfg, smap)
    flags = flag_problems(cfg, table)
    if flags:
        _version, note = _worker_version(cfg, table)
        if note is not None:
            warnings.append(note)
            warnings += [p.line(smap) for p in flags if p.versioned]
            flags = [p for p in flags if not p.versioned]
        errors += flags
    if errors:
        errors.sort(key=lambda p: _line_of(smap, p.path))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(errors[0].line(smap) + more)
    return warnings


def _line_of(smap: SourceMap, path: Path_) -> int:
    return int(smap.where(path).rsplit(":", 1)[1])


def stored_config_text(text: str) -> str:
    """The config text as stored with the study: URL passwords and any literal secret masked
    (``${VAR}`` references are kept: they are not secrets)."""
    return mask_text(text)


def check_size(
    cfg: StudyConfig,
    text: str,
    source: str,
    *,
    allow: bool = False,
    limit_bytes: float | None = None,
) -> sizing.SizeEstimate | None:
    """The workload's size estimate (None for small workloads); ConfigError when it exceeds
    ``limit_bytes`` and ``allow`` is false."""
    model = model_of(cfg)
    limit_bytes = sizing.LIMIT_BYTES if limit_bytes is None else limit_bytes
    est = sizing.estimate(cfg, model, hardware_of(cfg.hardware))
    if est is None or est.peak_bytes <= limit_bytes or allow:
        return est
    path: Path_ = ("workload", "num_prompts")
    raise ConfigError(
        f"{source_map(text, source).where(path)}: workload.num_prompts: {est.describe()}, "
        f"over the {limit_bytes / 1e9:g} GB limit: lower num_prompts, or pass "
        "--allow-large-workload to create it anyway"
    )
