"""``autotune sim serve``'s command line, parsed as ``vllm serve`` 0.32 parses its own.

Flags are spelled and defaulted as ``vllm serve`` 0.32 spells them. Every other flag of vLLM
0.32 (the shipped list, :mod:`autotune.profiles.flags`) is accepted, its value checked as vLLM
checks it, and logged as ignored (its dest prefixed ``ignored_``); a flag vLLM does not have,
or a value it refuses, is an argparse error (exit 2), as in vLLM. The simulator's own flags
(``--hardware``, ``--time-scale``, ``--sim-*``) are those of
:data:`autotune.profiles.flags.SIM_FLAGS`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

from autotune.profiles.flags import FlagSpec, check_value, flag_table

VLLM_FLAGS_VERSION = flag_table().vllm_version

__all__ = ["IGNORED_PREFIX", "build_parser", "normalize_argv"]

IGNORED_PREFIX = "ignored_"  # the dest prefix of the flags accepted and ignored

# The vLLM flags the simulation models, with the simulator's defaults; every other flag of
# vLLM 0.32 (autotune/profiles/vllm_flags.json) is accepted, checked as vLLM checks it, and
# ignored. A flag vLLM does not have is an argparse error (exit 2), as in vLLM.
# gpu_memory_utilization and block_size default to the device's (None until EngineArgs.resolve;
# docs/simulator.md#41-the-cpu-backend), as vLLM 0.32 leaves them to the platform.
_MODELED: dict[str, Any] = {
    "max_model_len": None,
    "gpu_memory_utilization": None,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "enable_chunked_prefill": None,
    "enable_prefix_caching": None,
    "tensor_parallel_size": 1,
    "block_size": None,
    "kv_cache_memory_bytes": None,
    "long_prefill_token_threshold": 0,
    "enforce_eager": False,
    "host": "127.0.0.1",
    "port": 8000,
    "api_key": None,
    "served_model_name": None,
}
_NOT_FLAGS = ("model",)  # vLLM's --model: the positional argument here


def _human_int(text: str) -> int:
    """vLLM's human_readable_int: ``32768``, ``32k`` (x1000), ``32K`` (x1024), ``1.5m``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if m is None:
        return int(text)
    number, suffix = m.group(1), m.group(2)
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * int(1024 ** ("KMGT".index(suffix) + 1))


def _typed(spec: FlagSpec, text: str) -> Any:
    """The value vLLM's type function makes of an accepted word."""
    if spec.optional and text in ("", "None"):
        return None
    if text in spec.words:
        return None if text == "auto" else text  # max_model_len auto: the model's maximum
    if spec.kind == "human_int":
        return _human_int(text)
    if spec.kind == "int":
        return int(text)
    if spec.kind == "float":
        return float(text)
    if spec.kind == "json":
        return json.loads(text)
    if spec.normalize == "lower_snake":
        return text.lower().replace("-", "_")
    return text


def _vllm_type(spec: FlagSpec) -> Callable[[str], Any]:
    """An argparse type reading a word as vLLM's type function for ``spec`` does."""

    def convert(text: str) -> Any:
        problem = check_value(_single(spec), text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem.split(": ", 1)[-1])
        value = _typed(spec, text)
        # vLLM takes any int here and fails at bind() with a traceback; a usage error is
        # the parser's to report (exit 2)
        if spec.dest == "port" and not 0 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
        return value

    convert.__name__ = spec.kind  # argparse names it in "invalid <name> value"
    return convert


def _single(spec: FlagSpec) -> FlagSpec:
    # the type sees one word at a time; choices are argparse's to check
    return FlagSpec(
        spec.dest,
        spec.options,
        spec.action,
        None,
        spec.kind,
        None,
        spec.optional,
        spec.words,
        spec.normalize,
    )


def _add_flag(group: Any, spec: FlagSpec, dest: str, default: Any) -> None:
    kw: dict[str, Any] = {"dest": dest, "default": default}
    opts = sorted((o for o in spec.options if not o.startswith("--no-")), key=len, reverse=True)
    if spec.kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
        opts = [o for o in opts if o.startswith("--")] + [o for o in opts if not o.startswith("--")]
    elif spec.kind == "flag":
        kw["action"] = "store_true"
        kw["default"] = bool(default)
    else:
        kw["type"] = _vllm_type(spec)
        if spec.nargs is not None:
            kw["nargs"] = spec.nargs
        if spec.action == "AppendAction":
            kw["action"] = "append"
        if spec.nargs == "?":
            kw["const"] = True
        if spec.choices is not None:
            # argparse checks choices after the type, as vLLM's parser does
            kw["choices"] = [_typed(spec, str(c)) for c in spec.choices]
            kw["metavar"] = "{" + ",".join(str(c) for c in spec.choices) + "}"
    group.add_argument(*opts, **kw)


def normalize_argv(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser spelling rules: ``--max_model_len`` is
    ``--max-model-len``; ``--compilation-config.mode 3`` (a field of a JSON flag) is
    accepted, and ignored here."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if not arg.startswith("--"):
            out.append(arg)
            continue
        key, eq, value = arg.partition("=")
        head, dot, _field = key.partition(".")
        head = "--" + head[2:].replace("_", "-")
        if dot:
            spec = flag_table().by_option.get(head)
            if spec is not None and spec.kind == "json":
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                skip = not eq and nxt is not None and not nxt.startswith("--")
                continue
            out.append(arg)  # argparse names it as unrecognized
            continue
        out.append(head + eq + value)
    return out


def _finite(*, positive: bool = False) -> Callable[[str], float]:
    """An argparse type for the --sim-* numbers: finite, and non-negative (or positive): an
    infinite --time-scale once started a server that never answered."""

    def number(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(x) or x < 0 or (positive and x == 0):
            what = "positive" if positive else "non-negative"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite {what} number")
        return x

    return number


class _Parser(argparse.ArgumentParser):
    """argparse with vLLM's error text and exit status 2, on one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="autotune sim serve",
        usage="autotune sim serve MODEL --hardware NAME [vllm flags] [--sim-* flags]",
        allow_abbrev=False,
        description="Serve a simulated vLLM engine with vLLM's OpenAI API and /metrics.",
    )
    p.add_argument("model", help="built-in model name or a folder holding config.json")
    sim = p.add_argument_group("simulation (not vLLM flags)")
    sim.add_argument(
        "--hardware",
        required=True,
        help="GPU profile (autotune sim hardware), or CPU for vLLM's CPU backend",
    )
    sim.add_argument(
        "--time-scale",
        type=_finite(positive=True),
        default=1.0,
        help="run the engine X times faster than wall time (reported in /version)",
    )
    sim.add_argument("--sim-seed", type=int, default=0)
    sim.add_argument(
        "--sim-request-log",
        metavar="FILE",
        help="write per-request timings (engine seconds) as JSON lines",
    )
    sim.add_argument(
        "--sim-startup-delay",
        type=_finite(),
        default=1.0,
        help="seconds standing for model loading (config errors after 1/4 of it)",
    )
    sim.add_argument("--sim-jitter-cv", type=_finite(), default=0.015)
    sim.add_argument(
        "--sim-other-tenant-gib",
        type=_finite(),
        default=0.0,
        help="device memory other processes hold at startup",
    )
    sim.add_argument("--sim-stats-interval", type=_finite(positive=True), default=10.0)
    sim.add_argument(
        "--sim-dump-env",
        metavar="PATH",
        help="write the environment this server received as JSON (tests of worker isolation); "
        "PATH an existing folder: one file per server in it, env-<pid>.json",
    )
    v = p.add_argument_group("vLLM engine and server flags")
    ign = p.add_argument_group(
        f"accepted and ignored (flags of vLLM {VLLM_FLAGS_VERSION} with no effect on the "
        "simulation)"
    )
    seen: set[str] = set()
    for spec in flag_table().by_option.values():
        if spec.dest in seen or spec.dest in _NOT_FLAGS:
            continue
        seen.add(spec.dest)
        if spec.dest in _MODELED:
            _add_flag(v, spec, spec.dest, _MODELED[spec.dest])
        else:
            _add_flag(ign, spec, IGNORED_PREFIX + spec.dest, None)
    return p
