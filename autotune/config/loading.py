"""Reading a config document: YAML to Python values with each value's line (a
:class:`SourceMap`), ``${VAR}`` and ``${VAR:-default}`` expanded in string values (not in
keys), then validated as a model. Every error is one line naming the file, the line and the
field, e.g. ``configs/x.yaml:12: slo.p99_ttft_ms: Input should be greater than 0``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autotune.config.schema import StudyConfig
from autotune.errors import ConfigError
from autotune.inputs import MAX_CONFIG_BYTES, check_yaml, read_regular_file

__all__ = [
    "FieldPath",
    "SourceMap",
    "load_config",
    "parse_config",
    "parse_document",
    "read_config_text",
    "source_map",
]

# a value's path in the document, as pydantic's ``loc`` and ConfigError.field give it
FieldPath = tuple[str | int, ...]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def _expand(value: str, where: str) -> str:
    def repl(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable ${{{var}}} is not set "
            f"(set it or write ${{{var}:-default}})"
        )

    return _ENV.sub(repl, value)


def _to_python(
    node: yaml.Node,
    src: str,
    lines: dict[FieldPath, int],
    path: FieldPath,
    expanded: set[FieldPath] | None = None,
) -> Any:
    """Build Python values from the YAML node tree, remembering each value's line (and, in
    ``expanded``, the paths of values that came from ``${VAR}``). A key given twice in one
    mapping is an error: YAML loaders keep the last one silently."""
    lines[path] = node.start_mark.line + 1
    where = f"{src}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:merge":
                raise ConfigError(
                    f"{src}:{k.start_mark.line + 1}: YAML merge keys (<<) are not supported; "
                    "write the fields out"
                )
            key = k.value if isinstance(k, yaml.ScalarNode) else yaml.safe_load(yaml.serialize(k))
            if str(key) in out:
                field = ".".join(str(p) for p in (*path, str(key)))
                raise ConfigError(
                    f"{src}:{k.start_mark.line + 1}: {field}: given twice (first on line "
                    f"{lines[(*path, str(key))]}); keep one"
                )
            out[str(key)] = _to_python(v, src, lines, (*path, str(key)), expanded)
            lines[(*path, str(key))] = k.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, src, lines, (*path, i), expanded) for i, v in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    if expanded is not None and "${" in node.value:
        expanded.add(path)
    if node.tag == "tag:yaml.org,2002:str" or "${" in node.value:
        text = _expand(node.value, where) if "${" in node.value else node.value
        if node.tag != "tag:yaml.org,2002:str" or node.style is None:
            # an unquoted ${X} that expands to a number or bool becomes that type
            return _load_scalar(text, where, path) if text.strip() else text
        return text
    return _load_scalar(yaml.serialize(node), where, path)


def _load_scalar(text: str, where: str, path: FieldPath) -> Any:
    """One value's YAML (a scalar, or what an unquoted ``${VAR}`` expanded to), with the
    document's limits (autotune.inputs.check_yaml) and one error line."""
    where = f"{where}: {'.'.join(str(p) for p in path) or '(top level)'}"
    check_yaml(text, where, lines=False)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:  # only from a ${VAR}'s text: the document parsed
        raise ConfigError(f"{where}: the expanded value is not valid YAML; quote it") from exc
    except ValueError as exc:
        # a date such as 2026-13-45, or an int over the 4,300 digits Python reads
        # (sys.get_int_max_str_digits); the value is not echoed: it may be megabytes long
        why = "a number of more than 4,300 digits" if "digits" in str(exc) else str(exc)
        raise ConfigError(f"{where}: cannot read the value ({why})") from exc


def _compose(text: str, source: str) -> yaml.Node:
    check_yaml(text, source)  # aliases, depth and size, before any node is built
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: invalid YAML ({problem})") from exc
    if node is None:
        raise ConfigError(f"{source}:1: the config is empty")
    return node


@dataclass(frozen=True)
class SourceMap:
    """Where each value of a config document is: its line, and whether it came from
    ``${VAR}`` (a secret written that way is not stored with the study)."""

    source: str
    lines: Mapping[FieldPath, int]
    expanded: frozenset[FieldPath]

    def where(self, path: FieldPath) -> str:
        """``file:line`` of the value at ``path`` (or of its nearest enclosing field)."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        return f"{self.source}:{self.lines.get(probe, 1)}"


def source_map(text: str, source: str = "<config>") -> SourceMap:
    """The :class:`SourceMap` of a document :func:`parse_config` accepted."""
    lines: dict[FieldPath, int] = {}
    expanded: set[FieldPath] = set()
    _to_python(_compose(text, source), source, lines, (), expanded)
    return SourceMap(source, lines, frozenset(expanded))


def parse_config(text: str, source: str = "<config>") -> StudyConfig:
    """Validate a YAML document; errors name ``source``, the line and the field."""
    return parse_document(text, source, StudyConfig)


M = TypeVar("M", bound=BaseModel)


def parse_document(text: str, source: str, model: type[M]) -> M:
    """Validate a YAML document as ``model`` (a study config, a nightly config, ...); every
    error is one line naming ``source``, the line and the field."""
    node = _compose(text, source)
    lines: dict[FieldPath, int] = {}
    data = _to_python(node, source, lines, ())
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of sections")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        probe = loc
        lineno = lines.get(probe)
        while lineno is None and probe:
            probe = probe[:-1]
            lineno = lines.get(probe)
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see configs/ for examples)"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ConfigError(f"{source}:{lineno or 1}: {field}: {msg}{more}", field=loc) from exc


def read_config_text(path: str | Path, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A config file's text: a regular file of at most ``max_bytes``, UTF-8; one error line
    if it cannot be read or decoded."""
    p = Path(path)
    data = read_regular_file(p, max_bytes, "config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{p}:{line}: the config is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start}); save it as UTF-8"
        ) from exc
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ConfigError(f"{p}:{line}: the config contains a NUL byte (is it a binary file?)")
    return text.removeprefix("\ufeff")


def load_config(path: str | Path) -> StudyConfig:
    return parse_config(read_config_text(path), str(Path(path)))
