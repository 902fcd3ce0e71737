"""The bad-input catalogue (issue 16): every kind of bad input a new user might give autotune,
with the one line and exit status each must produce.

``tests/test_bad_input.py`` runs every case through the console-script entry point against a
database that already holds a study, and checks the line, the status and that the database
is unchanged; ``scripts/bad_input_table.py`` renders the same cases, with what autotune
actually printed, as docs/bad-input.md.

A case's ``args`` may name ``{config}`` (the study YAML written from ``config``/``text``),
``{db}`` (the database URL), ``{data}`` (a data file written from ``data``) and ``{tmp}``.
``config`` is merged over :data:`BASE` (a value of None removes the key).
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["BASE", "CASES", "EXISTING", "Case", "merged", "prepare"]

EXISTING = "existing"  # the study every case's database already holds

BASE: dict[str, Any] = {
    "name": "fresh",
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "hardware": "A100-80GB",
    "workload": {
        "source": "synthetic",
        "num_prompts": 20,
        "input_len": 256,
        "output_len": 32,
        "arrival": "poisson",
        "rate": 2,
    },
    "slo": {"p99_ttft_ms": 3000},
    "strategy": {"n_trials": 2, "capacity_levels": 2},
}

CREATE = ("study", "create", "--config", "{config}", "--storage", "{db}")
RUN = ("study", "run", EXISTING, "--storage", "{db}")
SHAREGPT = {"source": "sharegpt", "path": "{data}", "arrival": "poisson", "rate": 2}
MOONCAKE = {"source": "mooncake", "path": "{data}", "arrival": "trace", "rate": None}
GOOD_ROW = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1]}


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # config field, worker flag, CLI flag, URL, data file, environment, size
    what: str
    args: tuple[str, ...] = CREATE
    config: dict[str, Any] | None = None
    text: str | bytes | None = None
    data: str | bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    code: int = 1
    line: str = ""  # must appear in the one error line
    xfail: str | None = None


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def _fill(text: str, subst: dict[str, str]) -> str:
    for key, value in subst.items():
        text = text.replace("{" + key + "}", value)
    return text


def prepare(case: Case, tmp: Path, seed: Path) -> tuple[list[str], Path]:
    """The case's files written under ``tmp`` (its config, its data), a copy of the seeded
    database ``seed`` beside them, and its arguments with the placeholders filled in."""
    db = tmp / "t.db"
    shutil.copy(seed, db)
    subst = {"tmp": str(tmp), "db": f"sqlite:///{db}", "config": str(tmp / "study.yaml")}
    subst["data"] = str(tmp / "data.jsonl")
    if case.data is not None:
        data = case.data if isinstance(case.data, bytes) else case.data.encode()
        (tmp / "data.jsonl").write_bytes(data)
    if case.text is not None:
        text = case.text if isinstance(case.text, bytes) else case.text.encode()
        (tmp / "study.yaml").write_bytes(text)
    else:
        body = yaml.safe_dump(merged(BASE, case.config or {}), sort_keys=False)
        (tmp / "study.yaml").write_text(_fill(body, subst), encoding="utf-8")
    return [_fill(a, subst) for a in case.args], db


def _w(**workload: Any) -> dict[str, Any]:
    return {"workload": workload}


def _static(**args: Any) -> dict[str, Any]:
    return {"worker": {"static_args": args}}


def _jsonl(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


_BASE_TEXT = "name: fresh\nhardware: A100-80GB\nmodel: {name: meta-llama/Llama-3.1-8B-Instruct}\n"


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML: each line's list holds nine copies of the previous one."""
    names = [f"l{i}" for i in range(levels)]
    rows = [f"{names[0]}: &{names[0]} [x, x, x, x, x, x, x, x, x]"]
    rows += [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in itertools.pairwise(names)]
    return "\n".join(rows) + "\n"


BOMB = _bomb()

_NIGHTLY_TEXT = """\
deployment: chat-prod
traffic: {source: traces, dir: /nonexistent, format: mooncake}
model: {name: meta-llama/Llama-3.1-8B-Instruct}
hardware: A100-80GB
slo: {p99_ttft_ms: 3000}
output: /nonexistent/out.yaml
budget: {n_trials: %s}
"""
NIGHTLY = ("nightly", "--config", "{config}", "--storage", "{db}")

# Hostile input: what a user who tries to break autotune sends (aliases, special files,
# numbers too large for their type, infinities, booleans for counts, empty strings, control
# characters, ports out of range); each is refused in one line before anything is stored.
HOSTILE: list[Case] = [
    Case(
        "hostile-yaml-bomb",
        "size",
        f"a {len(BOMB)}-byte YAML alias bomb (nine levels of &a/*a: 9^9 values expanded)",
        text=BOMB,
        line="study.yaml:2: YAML aliases (*l0) are not supported",
    ),
    Case(
        "hostile-yaml-anchor",
        "config file",
        "an anchor (&n) no alias uses",
        text="name: &n fresh\nhardware: A100-80GB\n",
        line="study.yaml:1: YAML anchors (&n) are not supported",
    ),
    Case(
        "hostile-yaml-deep",
        "size",
        "lists nested 100 deep",
        text="name: " + "[" * 100 + "]" * 100 + "\n",
        line="study.yaml:1: the document nests deeper than 64 levels",
    ),
    Case(
        "hostile-yaml-many-values",
        "size",
        "a list of 150,000 numbers",
        text="enqueue: [" + "1," * 150_000 + "1]\n",
        line="holds more than 100,000 values",
    ),
    Case(
        "hostile-int-5000-digits",
        "config field",
        "seed: a 5,000-digit number (Python reads at most 4,300)",
        text=_BASE_TEXT + "seed: " + "9" * 5000 + "\n",
        line="study.yaml:4: seed: cannot read the value (a number of more than 4,300 digits)",
    ),
    Case(
        "hostile-date-invalid",
        "config field",
        "seed: 2026-13-45 (YAML reads a date; month 13)",
        text=_BASE_TEXT + "seed: 2026-13-45\n",
        line="study.yaml:4: seed: cannot read the value (month must be in 1..12)",
    ),
    Case(
        "hostile-env-alias",
        "environment",
        "an unquoted ${VAR} whose value holds YAML aliases",
        text=_BASE_TEXT + "seed: ${AUTOTUNE_TEST_HOSTILE}\n",
        env={"AUTOTUNE_TEST_HOSTILE": "[&a [x, x], *a, *a]"},
        line="study.yaml:4: seed: YAML aliases (*a) are not supported",
    ),
    Case(
        "hostile-env-bad-yaml",
        "environment",
        "an unquoted ${VAR} whose value is not YAML",
        text=_BASE_TEXT + "seed: ${AUTOTUNE_TEST_HOSTILE}\n",
        env={"AUTOTUNE_TEST_HOSTILE": "[unclosed"},
        line="study.yaml:4: seed: the expanded value is not valid YAML; quote it",
    ),
    Case(
        "hostile-config-too-big",
        "size",
        "a 1.1 MB config (a long comment)",
        text="# " + "x" * 1_100_000 + "\n" + _BASE_TEXT,
        line="is 1,100,",
    ),
    Case(
        "hostile-config-max-bytes",
        "CLI flag",
        "create --max-config-bytes 100 on a normal config",
        args=(*CREATE, "--max-config-bytes", "100"),
        line="more than the 100 allowed",
    ),
    Case(
        "hostile-config-max-bytes-zero",
        "CLI flag",
        "create --max-config-bytes 0",
        args=(*CREATE, "--max-config-bytes", "0"),
        code=2,
        line="'--max-config-bytes'",
    ),
    Case(
        "hostile-config-dev-zero",
        "special file",
        "--config /dev/zero (never ends)",
        args=("study", "create", "--config", "/dev/zero", "--storage", "{db}"),
        line="/dev/zero: cannot read config (it is not a regular file",
    ),
    Case(
        "hostile-config-dev-null",
        "special file",
        "--config /dev/null",
        args=("study", "create", "--config", "/dev/null", "--storage", "{db}"),
        line="it is not a regular file",
    ),
    Case(
        "hostile-n-trials-bool",
        "config field",
        "strategy.n_trials: true (a boolean for a count)",
        config={"strategy": {"n_trials": True}},
        line="strategy.n_trials: Input should be a number, not the boolean true",
    ),
    Case(
        "hostile-num-prompts-bool",
        "config field",
        "workload.num_prompts: false",
        config=_w(num_prompts=False),
        line="workload.num_prompts: Input should be a number, not the boolean false",
    ),
    Case(
        "hostile-rate-bool",
        "config field",
        "workload.rate: true",
        config=_w(rate=True),
        line="workload.rate: Input should be a number, not the boolean true",
    ),
    Case(
        "hostile-candidates-bool",
        "config field",
        "max_model_len candidates holding true",
        config={"search": {"max_model_len": {"candidates": [2048, True]}}},
        line="search.max_model_len.candidates: Input should be a number, not the boolean",
    ),
    Case(
        "hostile-n-trials-huge",
        "config field",
        "strategy.n_trials: 1000000000000",
        config={"strategy": {"n_trials": 10**12}},
        line="strategy.n_trials: Input should be less than or equal to 100000",
    ),
    Case(
        "hostile-seed-beyond-64-bits",
        "config field",
        "seed: 10**30 (too large for a 64-bit column)",
        config={"seed": 10**30},
        line="seed: Input should be at most 9,223,372,036,854,775,807",
    ),
    Case(
        "hostile-rate-inf",
        "config field",
        "workload.rate: .inf",
        config=_w(rate=float("inf")),
        line="workload.rate: Input should be a finite number",
    ),
    Case(
        "hostile-rate-nan",
        "config field",
        "workload.rate: .nan",
        config=_w(rate=float("nan")),
        line="workload.rate: Input should be a finite number",
    ),
    Case(
        "hostile-timeout-inf",
        "config field",
        "strategy.timeout_s: .inf",
        config={"strategy": {"timeout_s": float("inf")}},
        line="strategy.timeout_s: Input should be a finite number",
    ),
    Case(
        "hostile-timeout-huge",
        "config field",
        "strategy.timeout_s: 1e12 (31,000 years)",
        config={"strategy": {"timeout_s": 1e12}},
        line="strategy.timeout_s: Input should be less than or equal to",
    ),
    Case(
        "hostile-slo-inf",
        "config field",
        "slo.p99_ttft_ms: .inf",
        config={"slo": {"p99_ttft_ms": float("inf")}},
        line="slo.p99_ttft_ms: Input should be a finite number",
    ),
    Case(
        "hostile-startup-timeout-nan",
        "config field",
        "worker.startup_timeout_s: .nan",
        config={"worker": {"startup_timeout_s": float("nan")}},
        line="worker.startup_timeout_s: Input should be a finite number",
    ),
    Case(
        "hostile-rate-tiny",
        "config field",
        "workload.rate: 1e-300 (arrivals beyond any integer second)",
        config=_w(rate=1e-300),
        line="workload.rate: 1e-300 is outside 1e-06 to 1e+06 requests/s",
    ),
    Case(
        "hostile-time-scale-huge",
        "config field",
        "workload.time_scale: 1e300",
        config=_w(time_scale=1e300),
        line="workload.time_scale: 1e+300 is outside 1e-06 to 1e+06",
    ),
    Case(
        "hostile-sigma-huge",
        "config field",
        "workload.input_sigma: 1e300 (overflowed the length sampler)",
        config=_w(input_sigma=1e300),
        line="workload.input_sigma: Input should be less than or equal to 10",
    ),
    Case(
        "hostile-model-name-20kb",
        "size",
        "a 20,000-character model name (longer than a file name may be)",
        config={"model": {"name": "m" * 20_000}},
        line="error: unknown model 'mmm",
    ),
    Case(
        "hostile-hardware-20kb",
        "size",
        "a 20,000-character hardware name (the error line is cut)",
        config={"hardware": "h" * 20_000},
        line="... (cut; 20,",
    ),
    Case(
        "hostile-nul-in-path",
        "config field",
        'model.config_json: "a\\0b" (a NUL made by a YAML escape)',
        text=_BASE_TEXT.replace("}\n", ', config_json: "a\\0b"}\n'),
        line="study.yaml:3: model.config_json: a value may not contain a NUL character",
    ),
    Case(
        "hostile-nul-in-env",
        "environment",
        "a NUL inside a worker.env value",
        config={"worker": {"env": {"OMP_NUM_THREADS": "4\x00"}}},
        line="worker.env: a value may not contain a NUL character",
    ),
    Case(
        "hostile-name-empty",
        "config field",
        "name: '' (an empty string)",
        config={"name": ""},
        line="name: String should match pattern",
    ),
    Case(
        "hostile-prometheus-url-empty",
        "URL",
        "telemetry.prometheus_url: ''",
        config={"telemetry": {"prometheus_url": ""}},
        line="telemetry.prometheus_url: is empty; give a URL",
    ),
    Case(
        "hostile-prometheus-url-control",
        "URL",
        "telemetry.prometheus_url with a newline inside",
        config={"telemetry": {"prometheus_url": "http://prom\n:9090"}},
        line="telemetry.prometheus_url: holds a control character",
    ),
    Case(
        "hostile-config-storage-empty",
        "URL",
        "storage: '' in the config",
        args=("study", "create", "--config", "{config}"),
        config={"storage": ""},
        line="the config's storage: the study database setting is empty",
    ),
    Case(
        "hostile-storage-empty",
        "CLI flag",
        "--storage '' (once fell back to the default file)",
        args=("study", "list", "--storage", ""),
        code=2,
        line="Invalid value for '--storage': is empty",
    ),
    Case(
        "hostile-storage-control",
        "URL",
        "--storage with a newline inside",
        args=("study", "list", "--storage", "sqlite:///{tmp}/a\nb.db"),
        line="--storage: the study database setting holds a control character",
    ),
    Case(
        "hostile-env-url-blank",
        "environment",
        "AUTOTUNE_DATABASE_URL holding only a newline",
        args=("study", "list"),
        env={"AUTOTUNE_DATABASE_URL": " \n"},
        line="$AUTOTUNE_DATABASE_URL: the study database setting is empty",
    ),
    Case(
        "hostile-env-url-control",
        "environment",
        "AUTOTUNE_DATABASE_URL with an escape character",
        args=("study", "list"),
        env={"AUTOTUNE_DATABASE_URL": "sqlite:///a\x1b[2J.db"},
        line="holds a control character ('\\x1b')",
    ),
    Case(
        "hostile-run-timeout-inf",
        "CLI flag",
        "run --timeout inf",
        args=(*RUN, "--timeout", "inf"),
        code=2,
        line="Invalid value for '--timeout': inf is not a positive number of seconds",
    ),
    Case(
        "hostile-run-n-trials-huge",
        "CLI flag",
        "run --n-trials 1000000000000",
        args=(*RUN, "--n-trials", "1000000000000"),
        code=2,
        line="Invalid value for '--n-trials'",
    ),
    Case(
        "hostile-create-n-trials-beyond-64-bits",
        "CLI flag",
        "create --run --n-trials 10**30",
        args=(*CREATE, "--run", "--n-trials", str(10**30)),
        code=2,
        line="Invalid value for '--n-trials'",
    ),
    Case(
        "hostile-sim-serve-port",
        "CLI flag",
        "sim serve --port 99999",
        args=("sim", "serve", "m", "--hardware", "H100-80GB", "--port", "99999"),
        code=2,
        line="argument --port: '99999' is not a port (0 to 65535)",
    ),
    Case(
        "hostile-sim-serve-port-negative",
        "CLI flag",
        "sim serve --port -1",
        args=("sim", "serve", "m", "--hardware", "H100-80GB", "--port=-1"),
        code=2,
        line="'-1' is not a port",
    ),
    Case(
        "hostile-sim-serve-time-scale-inf",
        "CLI flag",
        "sim serve --time-scale inf",
        args=("sim", "serve", "m", "--hardware", "H100-80GB", "--time-scale", "inf"),
        code=2,
        line="argument --time-scale: 'inf' is not a finite positive number",
    ),
    Case(
        "hostile-serve-port",
        "CLI flag",
        "serve --port 99999",
        args=("serve", "--port", "99999", "--storage", "{db}"),
        code=2,
        line="Invalid value for '--port'",
    ),
    Case(
        "hostile-bench-url-control",
        "URL",
        "bench --base-url with a newline inside",
        args=("bench", "--base-url", "http://127.0.0.1\n:8000", "--num-prompts", "1"),
        code=2,
        line="'--base-url': holds a control character",
    ),
    Case(
        "hostile-bench-rate-nan",
        "CLI flag",
        "bench --request-rate nan",
        args=("bench", "--base-url", "http://127.0.0.1:9", "--request-rate", "nan"),
        line="--request-rate: Input should be a finite number",
    ),
    Case(
        "hostile-bench-num-prompts-beyond-64-bits",
        "CLI flag",
        "bench --num-prompts 10**23",
        args=("bench", "--base-url", "http://127.0.0.1:9", "--num-prompts", str(10**23)),
        line="--num-prompts: Input should be at most 9,223,372,036,854,775,807",
    ),
    Case(
        "hostile-sim-run-num-requests-huge",
        "CLI flag",
        "sim run --num-requests 100000000000 (745 GiB of arrays)",
        args=(
            "sim",
            "run",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--hardware",
            "H100-80GB",
            "--num-requests",
            "100000000000",
        ),
        code=2,
        line="Invalid value for '--num-requests'",
    ),
    Case(
        "hostile-data-dev-zero",
        "special file",
        "a sharegpt path of /dev/zero",
        config={"workload": {**SHAREGPT, "path": "/dev/zero"}},
        line="/dev/zero: it is not a regular file",
    ),
    Case(
        "hostile-model-config-dev-zero",
        "special file",
        "model.config_json: /dev/zero",
        config={"model": {"config_json": "/dev/zero"}},
        line="/dev/zero: cannot read model config (it is not a regular file",
    ),
    Case(
        "hostile-token-file-dev-zero",
        "special file",
        "serve --token-file /dev/zero",
        args=("serve", "--token-file", "/dev/zero", "--storage", "{db}"),
        line="--token-file: cannot read /dev/zero (it is not a regular file",
    ),
    Case(
        "hostile-nightly-n-trials-bool",
        "config field",
        "a nightly config's budget.n_trials: true",
        args=NIGHTLY,
        text=_NIGHTLY_TEXT % "true",
        line="study.yaml:7: budget.n_trials: Input should be a number, not the boolean true",
    ),
    Case(
        "hostile-nightly-n-trials-huge",
        "config field",
        "a nightly config's budget.n_trials: 10**12",
        args=NIGHTLY,
        text=_NIGHTLY_TEXT % "1000000000000",
        line="study.yaml:7: budget.n_trials: Input should be less than or equal to 100000",
    ),
    Case(
        "hostile-export-disk-full",
        "special file",
        "export -o /dev/full (no space left)",
        args=("study", "export", EXISTING, "--storage", "{db}", "-o", "/dev/full"),
        line="/dev/full: cannot write (No space left on device)",
    ),
    Case(
        "hostile-trace-tokens-huge",
        "data file",
        "a Mooncake row with input_length 1e23",
        config={"workload": MOONCAKE},
        data=_jsonl(GOOD_ROW, {**GOOD_ROW, "timestamp": 1, "input_length": 1e23}),
        line="data.jsonl:2: field 'input_length': 1e+23 is more than the 2,147,483,647 allowed",
    ),
    Case(
        "hostile-trace-tokens-infinity",
        "data file",
        "a Mooncake row with input_length Infinity",
        config={"workload": MOONCAKE},
        data=_jsonl(GOOD_ROW, '{"timestamp": 1, "input_length": Infinity, "output_length": 1}'),
        line="expected a finite number",
    ),
    Case(
        "hostile-trace-tokens-bool",
        "data file",
        "a Mooncake row with output_length true",
        config={"workload": MOONCAKE},
        data=_jsonl(GOOD_ROW, {**GOOD_ROW, "timestamp": 1, "output_length": True}),
        line="expected a number, got True",
    ),
]

CASES: list[Case] = [
    # -- the config file ------------------------------------------------------------------
    Case(
        "config-missing",
        "config file",
        "the --config file does not exist",
        args=("study", "create", "--config", "{tmp}/nope.yaml", "--storage", "{db}"),
        line="nope.yaml: cannot read config",
    ),
    Case(
        "config-directory",
        "config file",
        "--config names a folder",
        args=("study", "create", "--config", "{tmp}", "--storage", "{db}"),
        line="cannot read config",
    ),
    Case(
        "config-not-utf8",
        "config file",
        "a Latin-1 config (not UTF-8)",
        text=b"name: fr\xe9sh\n",
        line="study.yaml:1: the config is not UTF-8 text",
    ),
    Case(
        "config-nul",
        "config file",
        "a binary file as config",
        text="name: x\n\0\0\n",
        line="contains a NUL byte",
    ),
    Case("config-empty", "config file", "an empty config", text="\n", line="the config is empty"),
    Case(
        "config-bad-yaml",
        "config file",
        "YAML that does not parse",
        text="name: [unclosed\n",
        line="invalid YAML",
    ),
    Case(
        "config-list",
        "config file",
        "a list instead of a mapping",
        text="- a\n- b\n",
        line="must be a mapping of sections",
    ),
    Case(
        "config-duplicate-top",
        "config file",
        "a top-level key given twice",
        text=_BASE_TEXT + "name: again\n",
        line="study.yaml:4: name: given twice",
    ),
    Case(
        "config-duplicate-nested",
        "config file",
        "a nested key given twice",
        text=_BASE_TEXT + "workload: {rate: 1, rate: 2}\n",
        line="workload.rate: given twice",
    ),
    Case(
        "config-merge-key",
        "config file",
        "a YAML merge key (<<)",
        text="base: &b {rate: 1}\nworkload:\n  <<: *b\n",
        line="merge keys (<<) are not",
    ),
    Case(
        "config-unset-env",
        "environment",
        "${VAR} that is not set",
        config={"hardware": "${AUTOTUNE_TEST_UNSET_VAR}"},
        line="${AUTOTUNE_TEST_UNSET_VAR} is not set",
    ),
    # -- config fields --------------------------------------------------------------------
    Case(
        "field-unknown-top",
        "config field",
        "an unknown top-level field",
        config={"bogus": 1},
        line="bogus: unknown field",
    ),
    Case(
        "field-unknown-nested",
        "config field",
        "a misspelled nested field",
        config={"slo": {"p99_ttft": 100}},
        line="slo.p99_ttft: unknown field",
    ),
    Case(
        "field-missing-name",
        "config field",
        "no study name",
        config={"name": None},
        line="name: Field required",
    ),
    Case(
        "field-bad-name",
        "config field",
        "a study name with a slash",
        config={"name": "a/b"},
        line="name: String should match pattern",
    ),
    Case(
        "field-unknown-hardware",
        "config field",
        "an unknown GPU profile",
        config={"hardware": "Z100"},
        line="unknown hardware profile 'Z100'",
    ),
    Case(
        "field-unknown-model",
        "config field",
        "an unknown model",
        config={"model": {"name": "no/such-model"}},
        line="unknown model 'no/such-model'",
    ),
    Case(
        "field-config-json-missing",
        "data file",
        "model.config_json that does not exist",
        config={"model": {"config_json": "{tmp}/none.json"}},
        line="none.json",
    ),
    Case(
        "field-worker-kind",
        "config field",
        "an unknown worker kind",
        config={"worker": {"kind": "gpu"}},
        line="worker.kind: Input should be",
    ),
    Case(
        "field-startup-timeout",
        "config field",
        "a negative startup timeout",
        config={"worker": {"startup_timeout_s": -1}},
        line="worker.startup_timeout_s: Input should be greater than 0",
    ),
    Case(
        "field-empty-executable",
        "config field",
        "an empty vllm_executable",
        config={"worker": {"vllm_executable": []}},
        line="worker.vllm_executable",
    ),
    Case(
        "field-env-name",
        "environment",
        "worker.env with a name that is not a variable",
        config={"worker": {"env": {"BAD-NAME": "1"}}},
        line="'BAD-NAME' is not an environment variable name",
    ),
    Case(
        "field-env-value",
        "environment",
        "worker.env with a number value",
        config={"worker": {"env": {"OMP_NUM_THREADS": 4}}},
        line="worker.env.OMP_NUM_THREADS: Input should be a valid string",
    ),
    Case(
        "field-env-passthrough",
        "environment",
        "env_passthrough with a bad pattern",
        config={"worker": {"env_passthrough": ["A*B"]}},
        line="'A*B' is not an environment variable name",
    ),
    Case(
        "field-gpus",
        "config field",
        "worker.gpus with a space",
        config={"worker": {"gpus": "0, 1"}},
        line="worker.gpus: '0, 1' is not a device list",
    ),
    Case(
        "field-gpus-all",
        "config field",
        "worker.gpus all (CUDA would see no device)",
        config={"worker": {"gpus": "all"}},
        line="worker.gpus: 'all' is not a device list here",
    ),
    Case(
        "field-jitter",
        "config field",
        "a jitter above 0.5",
        config={"worker": {"jitter_cv": 0.9}},
        line="worker.jitter_cv",
    ),
    Case(
        "field-num-prompts-zero",
        "config field",
        "num_prompts 0",
        config=_w(num_prompts=0),
        line="workload.num_prompts: Input should be greater than",
    ),
    Case(
        "field-source",
        "config field",
        "an unknown workload source",
        config=_w(source="csv"),
        line="workload.source: Input should be",
    ),
    Case(
        "field-source-needs-path",
        "config field",
        "sharegpt without a path",
        config=_w(source="sharegpt"),
        line="source 'sharegpt' needs 'path'",
    ),
    Case(
        "field-trace-needs-columns",
        "config field",
        "a generic trace without columns",
        config=_w(source="trace", path="x.csv", arrival="trace", rate=None),
        line="needs 'columns'",
    ),
    Case(
        "field-rate-missing",
        "config field",
        "poisson arrivals without a rate",
        config=_w(rate=None),
        line="arrival 'poisson' needs 'rate'",
    ),
    Case(
        "field-rate-zero",
        "config field",
        "a rate of 0",
        config=_w(rate=0),
        line="workload.rate: Input should be greater than 0",
    ),
    Case(
        "field-rate-text",
        "config field",
        "a rate written as text",
        config=_w(rate="fast"),
        line="workload.rate: Input should be a valid number",
    ),
    Case(
        "field-closed-needs-concurrency",
        "config field",
        "a closed loop without concurrency",
        config={"mode": "offline", "workload": {"arrival": "closed", "rate": None}},
        line="arrival 'closed' needs 'concurrency'",
    ),
    Case(
        "field-range-ratio",
        "config field",
        "range_ratio 1",
        config=_w(range_ratio=1.0),
        line="workload.range_ratio",
    ),
    Case(
        "field-trace-arrival-synthetic",
        "config field",
        "trace arrivals on synthetic requests",
        config=_w(arrival="trace", rate=None),
        line="needs a trace source",
    ),
    Case(
        "field-slo-negative",
        "config field",
        "a negative p99 TTFT",
        config={"slo": {"p99_ttft_ms": -5}},
        line="slo.p99_ttft_ms: Input should be greater",
    ),
    Case(
        "field-no-slo",
        "config field",
        "slo-capacity with no latency SLO",
        config={"slo": None},
        line="needs at least one latency SLO",
    ),
    Case(
        "field-offline-open-loop",
        "config field",
        "offline mode with Poisson arrivals",
        config={"mode": "offline"},
        line="mode 'offline' replays a closed loop",
    ),
    Case(
        "field-capacity-closed-loop",
        "config field",
        "slo-capacity on a closed loop",
        config=_w(arrival="closed", concurrency=8, rate=None),
        line="mode 'slo-capacity' scales an arrival rate",
    ),
    Case(
        "field-error-rate",
        "config field",
        "max_error_rate above 1",
        config={"slo": {"max_error_rate": 2}},
        line="slo.max_error_rate",
    ),
    Case(
        "field-mode",
        "config field",
        "an unknown mode",
        config={"mode": "fast"},
        line="mode: Input should be",
    ),
    Case(
        "field-range-order",
        "config field",
        "a search range with low > high",
        config={"search": {"gpu_memory_utilization": {"low": 0.95, "high": 0.8}}},
        line="low (0.95) must not exceed high (0.8)",
    ),
    Case(
        "field-extra-no-choices",
        "config field",
        "search.extra with no choices",
        config={"search": {"extra": [{"name": "enable_prefix_caching", "choices": []}]}},
        line="search.extra.0.choices",
    ),
    Case(
        "field-enqueue-unknown",
        "config field",
        "enqueue names an untuned parameter",
        config={"enqueue": [{"max_num_seq": 64}]},
        line="enqueue.0.max_num_seq: not a tuned",
    ),
    Case(
        "field-enqueue-out-of-space",
        "config field",
        "enqueue with a max_model_len that is not a candidate",
        config={"enqueue": [{"max_model_len": 200000}]},
        line="enqueue[0].max_model_len: 200000 is not in the search space",
    ),
    Case(
        "field-grace-shorter-than-outage",
        "config field",
        "a heartbeat grace period shorter than the database-outage tolerance",
        config={"controller": {"grace_period_s": 20, "db_outage_tolerance_s": 30}},
        line="controller: grace_period_s (20) must be at least",
    ),
    Case(
        "field-n-trials-zero",
        "config field",
        "strategy.n_trials 0",
        config={"strategy": {"n_trials": 0}},
        line="strategy.n_trials",
    ),
    Case(
        "field-capacity-order",
        "config field",
        "capacity_low above capacity_high",
        config={"strategy": {"capacity_low": 8, "capacity_high": 2}},
        line="capacity_low (8) must be below capacity_high (2)",
    ),
    Case(
        "field-capacity-levels",
        "config field",
        "capacity_levels 1",
        config={"strategy": {"capacity_levels": 1}},
        line="strategy.capacity_levels",
    ),
    Case(
        "field-timeout-negative",
        "config field",
        "strategy.timeout_s -5",
        config={"strategy": {"timeout_s": -5}},
        line="strategy.timeout_s",
    ),
    Case(
        "field-prometheus-url",
        "URL",
        "telemetry.prometheus_url that is not http",
        config={"telemetry": {"prometheus_url": "prometheus:9090"}},
        line="is not an http:// or https:// URL",
    ),
    Case(
        "field-prometheus-port",
        "URL",
        "telemetry.prometheus_url with a text port",
        config={"telemetry": {"prometheus_url": "http://h:port/"}},
        line="is not a URL",
    ),
    Case(
        "field-scrape-interval",
        "config field",
        "scrape_interval_s 0",
        config={"telemetry": {"scrape_interval_s": 0}},
        line="telemetry.scrape_interval_s",
    ),
    Case(
        "field-mml-fits-no-prompt",
        "config field",
        "max_model_len candidates shorter than every prompt",
        config={"search": {"max_model_len": {"candidates": [64, 128]}}},
        line="max_model_len",
    ),
    # -- worker flags (worker.static_args, search.extra) ----------------------------------
    Case(
        "flag-unknown",
        "worker flag",
        "a flag vLLM does not have",
        config=_static(bogus_flag=1),
        line="worker.static_args.bogus_flag: not a flag of vllm serve 0.32",
    ),
    Case(
        "flag-removed",
        "worker flag",
        "disable_log_requests (gone in vLLM 0.32)",
        config=_static(disable_log_requests=True),
        line="disable_log_requests: not a flag of vllm serve 0.32",
    ),
    Case(
        "flag-int-text",
        "worker flag",
        "block_size: abc",
        config=_static(block_size="abc"),
        line="--block-size: 'abc' is not an integer",
    ),
    Case(
        "flag-choice",
        "worker flag",
        "dtype outside its choices",
        config=_static(dtype="int7"),
        line="--dtype: 'int7' is not one of",
    ),
    Case(
        "flag-bool-text",
        "worker flag",
        "a switch given a word",
        config=_static(enforce_eager="yes"),
        line="--enforce-eager is a switch",
    ),
    Case(
        "flag-store-true-false",
        "worker flag",
        "a switch with no --no- form set false",
        config=_static(disable_log_stats=False),
        line="without a --no- form",
    ),
    Case(
        "flag-human-int",
        "worker flag",
        "kv_cache_memory_bytes: 1.5K",
        config=_static(kv_cache_memory_bytes="1.5K"),
        line="is not an integer (or 32k",
    ),
    Case(
        "flag-list-for-one",
        "worker flag",
        "a list for a one-value flag",
        config=_static(tensor_parallel_size=[1, 2]),
        line="takes one value, not a list",
    ),
    Case(
        "flag-json",
        "worker flag",
        "compilation_config that is not JSON",
        config=_static(compilation_config="level3"),
        line="is not JSON",
    ),
    Case(
        "flag-bad-name",
        "worker flag",
        "a flag name with a space",
        config=_static(**{"max num seqs": 4}),
        line="is not a flag name",
    ),
    Case(
        "flag-twice",
        "worker flag",
        "one flag under two spellings",
        config=_static(enforce_eager=True, **{"enforce-eager": True}),
        line="given twice",
    ),
    Case(
        "flag-port",
        "worker flag",
        "port (autotune sets it)",
        config=_static(port=8001),
        line="worker.static_args.port: --port is set by autotune",
    ),
    Case(
        "flag-host",
        "worker flag",
        "host (autotune sets it)",
        config=_static(host="0.0.0.0"),
        line="--host is set by autotune",
    ),
    Case(
        "flag-model",
        "worker flag",
        "model (autotune sets it)",
        config=_static(model="x"),
        line="--model is set by autotune",
    ),
    Case(
        "flag-served-name",
        "worker flag",
        "served_model_name (autotune sets it)",
        config=_static(served_model_name="x"),
        line="model.served_name",
    ),
    Case(
        "flag-tuned",
        "worker flag",
        "a tuned flag (max_num_seqs)",
        config=_static(max_num_seqs=64),
        line="--max-num-seqs is tuned by autotune",
    ),
    Case(
        "flag-tuned-alias",
        "worker flag",
        "a tuned flag under its alias",
        config=_static(device_memory_utilization=0.8),
        line="tuned by autotune",
    ),
    Case(
        "flag-extra",
        "worker flag",
        "a flag search.extra tunes",
        config={
            "worker": {"static_args": {"enable_prefix_caching": True}},
            "search": {"extra": [{"name": "enable_prefix_caching", "choices": [True, False]}]},
        },
        line="it is in search.extra",
    ),
    Case(
        "flag-sim-hardware",
        "worker flag",
        "the simulator's --hardware in static_args",
        config={"worker": {"kind": "sim", "static_args": {"hardware": "H100-80GB"}}},
        line="--hardware is set by autotune",
    ),
    Case(
        "flag-sim-only",
        "worker flag",
        "a sim-server flag for the in-process worker",
        config=_static(sim_other_tenant_gib=1),
        line="only worker.kind 'sim' takes it",
    ),
    Case(
        "flag-extra-unknown",
        "worker flag",
        "search.extra names no vLLM flag",
        config={"search": {"extra": [{"name": "enable_turbo", "choices": [1, 2]}]}},
        line="search.extra.0.name: not a flag of vllm serve",
    ),
    Case(
        "flag-extra-bad-choice",
        "worker flag",
        "search.extra with an invalid choice",
        config={
            "search": {"extra": [{"name": "enable_prefix_caching", "choices": [True, "maybe"]}]}
        },
        line="search.extra.0.choices.1",
    ),
    Case(
        "flag-extra-tuned",
        "worker flag",
        "search.extra names a tuned parameter",
        config={"search": {"extra": [{"name": "max_num_seqs", "choices": [8, 16]}]}},
        line="cannot be an extra parameter",
    ),
    # -- secrets --------------------------------------------------------------------------
    Case(
        "secret-api-key",
        "worker flag",
        "a literal api_key in static_args",
        config=_static(api_key="sk-literal-123"),
        line="write it as ${API_KEY}",
    ),
    Case(
        "secret-env",
        "environment",
        "a literal HF_TOKEN in worker.env",
        config={"worker": {"env": {"HF_TOKEN": "hf_literal"}}},
        line="write it as ${HF_TOKEN} or list HF_TOKEN in worker.env_passthrough",
    ),
    Case(
        "secret-prometheus",
        "URL",
        "a password inside telemetry.prometheus_url",
        config={"telemetry": {"prometheus_url": "http://u:pw-literal@prom:9090"}},
        line="write the URL as ${PROMETHEUS_URL}",
    ),
    # -- data files -----------------------------------------------------------------------
    Case(
        "data-missing",
        "data file",
        "a sharegpt path that does not exist",
        config={"workload": {**SHAREGPT, "path": "{tmp}/none.json"}},
        line="none.json",
    ),
    Case(
        "data-bad-json",
        "data file",
        "a sharegpt file that is not JSON",
        config={"workload": SHAREGPT},
        data="[{]\n",
        line="data.jsonl",
    ),
    Case(
        "data-bad-row",
        "data file",
        "a Mooncake trace with a malformed row",
        config={"workload": MOONCAKE},
        data=_jsonl(GOOD_ROW, '{"timestamp": 5, "input_length": 3,'),
        line="data.jsonl:2",
    ),
    Case(
        "data-missing-field",
        "data file",
        "a Mooncake row without output_length",
        config={"workload": MOONCAKE},
        data=_jsonl(GOOD_ROW, {"timestamp": 1, "input_length": 5}),
        line="output_length",
    ),
    # -- command-line flags ---------------------------------------------------------------
    Case(
        "cli-create-no-config",
        "CLI flag",
        "study create without --config",
        args=("study", "create", "--storage", "{db}"),
        code=2,
        line="Missing option",
    ),
    Case(
        "cli-n-trials-without-run",
        "CLI flag",
        "create --n-trials without --run",
        args=(*CREATE, "--n-trials", "2"),
        code=2,
        line="applies only with --run",
    ),
    Case(
        "cli-create-n-trials-zero",
        "CLI flag",
        "create --run --n-trials 0",
        args=(*CREATE, "--run", "--n-trials", "0"),
        code=2,
        line="'--n-trials'",
    ),
    Case(
        "cli-run-n-trials-zero",
        "CLI flag",
        "run --n-trials 0",
        args=("study", "run", EXISTING, "--storage", "{db}", "--n-trials", "0"),
        code=2,
        line="Invalid value for '--n-trials'",
    ),
    Case(
        "cli-run-n-trials-text",
        "CLI flag",
        "run --n-trials abc",
        args=("study", "run", EXISTING, "--storage", "{db}", "--n-trials", "abc"),
        code=2,
        line="Invalid value for '--n-trials'",
    ),
    Case(
        "cli-run-timeout-negative",
        "CLI flag",
        "run --timeout -5",
        args=("study", "run", EXISTING, "--storage", "{db}", "--timeout", "-5"),
        code=2,
        line="-5 is not a positive number of seconds",
    ),
    Case(
        "cli-run-timeout-nan",
        "CLI flag",
        "run --timeout nan",
        args=("study", "run", EXISTING, "--storage", "{db}", "--timeout", "nan"),
        code=2,
        line="'--timeout'",
    ),
    Case(
        "cli-run-unknown-study",
        "CLI flag",
        "run a study that does not exist",
        args=("study", "run", "nope", "--storage", "{db}"),
        code=4,
        line="no study named 'nope'",
    ),
    Case(
        "cli-show-unknown-study",
        "CLI flag",
        "show a study that does not exist",
        args=("study", "show", "nope", "--storage", "{db}"),
        code=4,
        line="'nope'",
    ),
    Case(
        "cli-best-no-trial",
        "CLI flag",
        "best of a study with no feasible trial",
        args=("study", "best", EXISTING, "--storage", "{db}"),
        code=4,
        line="has no feasible trial",
    ),
    Case(
        "cli-export-format",
        "CLI flag",
        "export --format xml",
        args=("study", "export", EXISTING, "--storage", "{db}", "--format", "xml"),
        line="--format must be json, csv, requests-jsonl or llmd-report",
    ),
    Case(
        "cli-size-two-targets",
        "CLI flag",
        "size with both a target rate and a target concurrency",
        args=("size", "--config", "{config}", "--target-rate", "3", "--target-concurrency", "4"),
        code=2,
        line="give exactly one of --target-rate and --target-concurrency",
    ),
    Case(
        "cli-size-real-hardware",
        "CLI flag",
        "size --worker vllm for two GPU types (one host has one)",
        args=(
            "size",
            "--config",
            "{config}",
            "--target-rate",
            "3",
            "--worker",
            "vllm",
            "--hardware",
            "H100-80GB,A100-80GB",
        ),
        code=2,
        line="--worker vllm measures this host's GPUs: give one GPU type, not H100-80GB, A100-80GB",
    ),
    Case(
        "cli-size-price",
        "CLI flag",
        "size --price for a GPU type autotune does not know",
        args=("size", "--config", "{config}", "--target-rate", "3", "--price", "H100=2.49"),
        line="--price 'H100=2.49': unknown hardware profile 'H100'",
    ),
    Case(
        "cli-export-output",
        "CLI flag",
        "export -o into a folder that does not exist",
        args=("study", "export", EXISTING, "--storage", "{db}", "-o", "{tmp}/no/x.json"),
        line="cannot write",
    ),
    Case(
        "cli-delete-unknown",
        "CLI flag",
        "delete a study that does not exist",
        args=("study", "delete", "nope", "--storage", "{db}"),
        code=4,
        line="'nope'",
    ),
    Case(
        "cli-create-existing",
        "CLI flag",
        "create a study whose name exists",
        config={"name": EXISTING},
        line=f"study '{EXISTING}' already exists",
    ),
    Case(
        "cli-unknown-option",
        "CLI flag",
        "an unknown option",
        args=("study", "list", "--storage", "{db}", "--bogus"),
        code=2,
        line="No such option: --bogus",
    ),
    Case(
        "cli-unknown-command",
        "CLI flag",
        "an unknown command",
        args=("study", "frobnicate"),
        code=2,
        line="No such command 'frobnicate'",
    ),
    Case(
        "cli-missing-argument",
        "CLI flag",
        "show without a study name",
        args=("study", "show"),
        code=2,
        line="Missing argument",
    ),
    Case(
        "cli-log-level",
        "CLI flag",
        "an unknown --log-level",
        args=("--log-level", "LOUD", "study", "list", "--storage", "{db}"),
        line="unknown log level 'LOUD'",
    ),
    Case(
        "cli-bench-url",
        "URL",
        "bench --base-url that is not a URL",
        args=("bench", "--base-url", "localhost:8000", "--num-prompts", "1"),
        code=2,
        line="not an http:// or https:// URL",
    ),
    Case(
        "cli-bench-num-prompts",
        "CLI flag",
        "bench --num-prompts 0",
        args=("bench", "--base-url", "http://127.0.0.1:9", "--num-prompts", "0"),
        line="--num-prompts",
    ),
    Case(
        "cli-sim-serve-flag",
        "worker flag",
        "sim serve with a flag vLLM does not have",
        args=("sim", "serve", "m", "--hardware", "H100-80GB", "--swap-space", "4"),
        code=2,
        line="unrecognized arguments: --swap-space 4",
    ),
    Case(
        "cli-sim-serve-value",
        "worker flag",
        "sim serve --block-size abc",
        args=("sim", "serve", "m", "--hardware", "H100-80GB", "--block-size", "abc"),
        code=2,
        line="argument --block-size: 'abc' is not an integer",
    ),
    Case(
        "cli-sim-run-hardware",
        "CLI flag",
        "sim run on an unknown GPU",
        args=("sim", "run", "meta-llama/Llama-3.1-8B-Instruct", "--hardware", "Z100"),
        line="unknown hardware profile",
    ),
    # -- parallel trials (docs/parallel.md) ---------------------------------------------
    Case(
        "cli-run-gpus-text",
        "CLI flag",
        "run --gpus '0, 1' (a space)",
        args=(*RUN, "--gpus", "0, 1"),
        code=2,
        line="Invalid value for '--gpus': '0, 1' is not a device list",
    ),
    Case(
        "cli-run-gpus-twice",
        "CLI flag",
        "run --gpus 0,1,0 (a device twice)",
        args=(*RUN, "--gpus", "0,1,0"),
        code=2,
        line="'0,1,0' lists device 0 twice",
    ),
    Case(
        "cli-run-gpus-per-trial-not-dividing",
        "CLI flag",
        "run --gpus 0,1,2 --gpus-per-trial 2",
        args=(*RUN, "--gpus", "0,1,2", "--gpus-per-trial", "2"),
        code=2,
        line="'--gpus-per-trial': 2 does not divide the 3 device(s) of --gpus 0,1,2",
    ),
    Case(
        "cli-run-gpus-per-trial-zero",
        "CLI flag",
        "run --gpus 0,1 --gpus-per-trial 0",
        args=(*RUN, "--gpus", "0,1", "--gpus-per-trial", "0"),
        code=2,
        line="Invalid value for '--gpus-per-trial'",
    ),
    Case(
        "cli-run-gpus-per-trial-alone",
        "CLI flag",
        "run --gpus-per-trial 2 without --gpus",
        args=(*RUN, "--gpus-per-trial", "2"),
        code=2,
        line="'--gpus-per-trial': applies only with --gpus",
    ),
    Case(
        "cli-create-gpus-without-run",
        "CLI flag",
        "create --gpus without --run",
        args=(*CREATE, "--gpus", "0,1"),
        code=2,
        line="'--gpus': applies only with --run",
    ),
    Case(
        "cli-create-gpus-tp-conflict",
        "CLI flag",
        "create --run --gpus 0,1,2,3 --gpus-per-trial 1 with tensor_parallel_size 2",
        args=(*CREATE, "--run", "--gpus", "0,1,2,3", "--gpus-per-trial", "1"),
        config=_static(tensor_parallel_size=2),
        line="--gpus-per-trial 1 conflicts with worker.static_args.tensor_parallel_size 2",
    ),
    Case(
        "cli-create-gpus-tp-not-dividing",
        "CLI flag",
        "create --run --gpus 0,1,2 with tensor_parallel_size 2",
        args=(*CREATE, "--run", "--gpus", "0,1,2"),
        config=_static(tensor_parallel_size=2),
        line="tensor_parallel_size 2, 2 device(s), does not divide the 3 device(s) of --gpus",
    ),
    # -- database URLs --------------------------------------------------------------------
    Case(
        "url-storage-garbage",
        "URL",
        "--storage garbage://::",
        args=("study", "list", "--storage", "garbage://::"),
        line="--storage: the study database setting is not a database URL",
    ),
    Case(
        "url-storage-port",
        "URL",
        "--storage with a text port",
        args=("study", "list", "--storage", "postgresql://u@localhost:abc/x"),
        line="--storage: the study database setting is not a database URL",
    ),
    Case(
        "url-env-garbage",
        "environment",
        "AUTOTUNE_DATABASE_URL='garbage://::'",
        args=("study", "list"),
        env={"AUTOTUNE_DATABASE_URL": "garbage://::"},
        line="$AUTOTUNE_DATABASE_URL: the study database setting is not a database URL",
    ),
    Case(
        "url-config-storage",
        "URL",
        "storage: in the config is not a URL",
        args=("study", "create", "--config", "{config}"),
        config={"storage": "garbage://::"},
        line="the config's storage: the study database setting is not",
    ),
    Case(
        "url-driver",
        "URL",
        "a database driver autotune does not ship",
        args=("study", "list", "--storage", "mysql://u@h/x"),
        line="cannot use the study database URL",
    ),
    Case(
        "url-sqlite-folder",
        "URL",
        "a SQLite file in a folder that does not exist",
        args=("study", "list", "--storage", "sqlite:///{tmp}/no/such/x.db"),
        line="cannot open the study database",
    ),
    Case(
        "url-unreachable",
        "URL",
        "PostgreSQL that does not answer (password masked)",
        args=("study", "list", "--storage", "postgresql://u:pw-secret@127.0.0.1:1/x"),
        code=5,
        line="postgresql+psycopg://u:***@127.0.0.1:1/x",
    ),
    # -- workload size --------------------------------------------------------------------
    Case(
        "size-million",
        "size",
        "a million prompts",
        config=_w(num_prompts=1_000_000),
        line="1,000,000 prompts need about",
    ),
    *HOSTILE,
]
