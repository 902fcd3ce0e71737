"""Bad workload input: one ConfigError each, one line, naming the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.workload import load_azure, load_mooncake, load_sharegpt, load_trace
from autotune.workload.core import Workload

GOOD_MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
SHAREGPT_OK = {
    "conversations": [
        {"from": "human", "value": "word " * 10},
        {"from": "gpt", "value": "word " * 10},
    ]
}
MAP = {"timestamp": "t", "input_length": "i", "output_length": "o"}


def mooncake_lines(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def one_per_line(*entries: object) -> str:
    """A JSON array with one entry per line: entry k (from 0) starts on line k + 2."""
    body = ",\n".join(e if isinstance(e, str) else json.dumps(e) for e in entries)
    return "[\n" + body + "\n]\n"


def row(**changes: object) -> dict[str, object]:
    return {**GOOD_MOONCAKE, **changes}


# (file name, content, loader, line, field or other fragment the message must hold)
CASES: list[tuple[str, str, Callable[[Path], Workload], int | None, str]] = [
    (
        "t.jsonl",
        mooncake_lines(row(), row(), '{"timestamp": 5, "input_length": 3,'),
        load_mooncake,
        3,
        "malformed JSON",
    ),
    ("t.jsonl", mooncake_lines(row(), "[1, 2]"), load_mooncake, 2, "expected a JSON object"),
    (
        "t.jsonl",
        mooncake_lines(row(), {"timestamp": 1, "input_length": 5, "hash_ids": []}),
        load_mooncake,
        2,
        "'output_length'",
    ),
    (
        "t.jsonl",
        mooncake_lines(row(timestamp=5), row(timestamp=4)),
        load_mooncake,
        2,
        "'timestamp'",
    ),
    ("t.jsonl", mooncake_lines(row(timestamp=-1)), load_mooncake, 1, "'timestamp'"),
    ("t.jsonl", mooncake_lines(row(), row(input_length=12.5)), load_mooncake, 2, "'input_length'"),
    ("t.jsonl", mooncake_lines(row(), row(output_length=-3)), load_mooncake, 2, "'output_length'"),
    (
        "t.jsonl",
        mooncake_lines(row(), row(output_length="ten")),
        load_mooncake,
        2,
        "'output_length'",
    ),
    ("t.jsonl", mooncake_lines(row(hash_ids="abc")), load_mooncake, 1, "'hash_ids'"),
    ("t.jsonl", mooncake_lines(row(hash_ids={"a": 1})), load_mooncake, 1, "'hash_ids'"),
    ("t.jsonl", mooncake_lines(row(timestamp=True)), load_mooncake, 1, "'timestamp'"),
    (
        "az.csv",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:47.1,374\n",
        load_azure,
        3,
        "expected 3 fields",
    ),
    ("az.csv", AZURE_HEADER + AZURE_ROW + "yesterday,374,44\n", load_azure, 3, "'TIMESTAMP'"),
    (
        "az.csv",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:45.0000000,374,44\n",
        load_azure,
        3,
        "sorted",
    ),
    (
        "az.csv",
        AZURE_HEADER + AZURE_ROW + "2023-02-30 18:15:45.0,374,44\n",
        load_azure,
        3,
        "'TIMESTAMP'",
    ),
    ("az.csv", "TIMESTAMP,Context,GeneratedTokens\n" + AZURE_ROW, load_azure, 1, "'ContextTokens'"),
    (
        "az.csv",
        AZURE_HEADER + AZURE_ROW + '"2023-11-16 18:15:47,1,2\n',
        load_azure,
        3,
        "malformed CSV",
    ),
    (
        "sg.json",
        one_per_line(SHAREGPT_OK, '{"conversations": [,]}'),
        lambda p: load_sharegpt(p, 2),
        3,
        "malformed JSON",
    ),
    (
        "sg.json",
        one_per_line(SHAREGPT_OK, SHAREGPT_OK) + "x",
        lambda p: load_sharegpt(p, 2),
        5,
        "after the array",
    ),
    (
        "sg.json",
        "[\n" + json.dumps(SHAREGPT_OK) + "\n" + json.dumps(SHAREGPT_OK) + "\n]",
        lambda p: load_sharegpt(p, 2),
        3,
        "expected ',' or ']'",
    ),
    (
        "sg.json",
        one_per_line(SHAREGPT_OK, {"conversations": [{"value": 3}, {"value": "x"}]}),
        lambda p: load_sharegpt(p, 2),
        3,
        "'conversations[0].value'",
    ),
    (
        "sg.json",
        one_per_line(SHAREGPT_OK, {"conversations": "hello"}),
        lambda p: load_sharegpt(p, 2),
        3,
        "'conversations'",
    ),
    (
        "sg.json",
        one_per_line(SHAREGPT_OK, 5),
        lambda p: load_sharegpt(p, 2),
        3,
        "expected a JSON object",
    ),
    (
        "sg.json",
        json.dumps({"conversations": []}),
        lambda p: load_sharegpt(p, 2),
        1,
        "expected a JSON array",
    ),
    (
        "g.csv",
        "t,i,o\n0,5,5\n",
        lambda p: load_trace(p, {**MAP, "input_length": "inp"}),
        1,
        "'inp'",
    ),
    ("g.csv", "t,i,o\n0,5,5\n1,5,5\n-1,5,5\n", lambda p: load_trace(p, MAP), 4, "'t'"),
    ("g.csv", "t,i,o\n0,5,5\n1,5,5\n,5,5\n", lambda p: load_trace(p, MAP), 4, "'t'"),
    (
        "g.csv",
        "t,i,o\n0,5,5\n2024-01-01 00:00:00,5,5\n",
        lambda p: load_trace(p, MAP),
        3,
        "one form",
    ),
    (
        "g.jsonl",
        mooncake_lines({"t": 0, "i": 5, "o": 5}, {"t": 1, "o": 5}),
        lambda p: load_trace(p, MAP),
        2,
        "'i'",
    ),
    (
        "g.jsonl",
        mooncake_lines({"t": 0, "i": 5, "o": 5}, {"t": "inf", "i": 5, "o": 5}),
        lambda p: load_trace(p, MAP),
        2,
        "'t'",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "loader", "line", "fragment"),
    CASES,
    ids=[f"{i}-{c[0]}-{c[4]}" for i, c in enumerate(CASES)],
)
def test_bad_file_content_names_file_line_and_field(
    tmp_path: Path,
    name: str,
    content: str,
    loader: Callable[[Path], Workload],
    line: int | None,
    fragment: str,
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        loader(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}:"), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "loader",
    [load_mooncake, load_azure, lambda p: load_sharegpt(p, 1), lambda p: load_trace(p, MAP)],
)
def test_missing_file(tmp_path: Path, loader: Callable[[Path], Workload]) -> None:
    path = tmp_path / "nope" / "trace.jsonl"
    with pytest.raises(ConfigError, match="no such file") as info:
        loader(path)
    assert str(info.value).startswith(str(path))


def test_empty_and_unusable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.csv:1: empty CSV"):
        load_azure(empty)
    zeros = tmp_path / "zeros.csv"
    zeros.write_text(AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,0\n")
    with pytest.raises(ConfigError, match="no usable requests"):
        load_azure(zeros)
    short = tmp_path / "sg.json"
    short.write_text(json.dumps([{"conversations": [{"value": "hi"}, {"value": "yo"}]}]))
    with pytest.raises(ConfigError, match="length filter"):
        load_sharegpt(short, 3)


def test_bad_options_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(mooncake_lines(row(), row(timestamp=10)))
    with pytest.raises(ConfigError, match="rate_scale"):
        load_mooncake(path, rate_scale=0.0)
    with pytest.raises(ConfigError, match="time_scale"):
        load_mooncake(path, time_scale=-1.0)
    with pytest.raises(ConfigError, match="max_requests"):
        load_mooncake(path, max_requests=0)
    with pytest.raises(ConfigError, match="unknown field 'input_len'"):
        load_trace(path, {"input_len": "input_length", "output_length": "output_length"})
    with pytest.raises(ConfigError, match="needs 'output_length'"):
        load_trace(path, {"input_length": "input_length"})
    with pytest.raises(ConfigError, match="num_requests"):
        load_sharegpt(path, 0)
