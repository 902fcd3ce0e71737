"""Trace parsers: Mooncake (hash-id prefixes), Azure (7-digit timestamps), generic mapping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.workload import MOONCAKE_BLOCK_SIZE, load_azure, load_mooncake, load_trace


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


MOONCAKE_ROWS: list[dict[str, object]] = [
    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 3]},
    {"timestamp": 3000, "input_length": 300, "output_length": 30, "hash_ids": [4]},
    {"timestamp": 5999, "input_length": 2000, "output_length": 40, "hash_ids": [0]},
]


def test_mooncake_rows_timestamps_and_lengths(tmp_path: Path) -> None:
    w = load_mooncake(write_jsonl(tmp_path / "trace.jsonl", MOONCAKE_ROWS))
    assert [r.prompt_len for r in w.requests] == [1200, 1100, 300, 2000]
    assert [r.output_len for r in w.requests] == [10, 20, 30, 40]
    np.testing.assert_allclose(w.arrivals(), [0.0, 0.0, 3.0, 5.999])  # type: ignore[arg-type]
    assert all(
        r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.prompt_len
        for r in w.requests
    )


def test_mooncake_hash_ids_give_shared_512_token_prefixes(tmp_path: Path) -> None:
    w = load_mooncake(write_jsonl(tmp_path / "trace.jsonl", MOONCAKE_ROWS))
    a, b, c, d = (r.prompt_token_ids for r in w.requests)
    assert a is not None and b is not None and c is not None and d is not None
    bs = MOONCAKE_BLOCK_SIZE
    assert a[: 2 * bs] == b[: 2 * bs]  # hash ids 0, 1 shared
    assert a[2 * bs] != b[2 * bs] or a[2 * bs : 2 * bs + 16] != b[2 * bs : 2 * bs + 16]
    assert a[:bs] == d[:bs]  # hash id 0 again, two rows later
    assert d[bs:] != a[bs:1100]  # too few hash ids: a request-unique tail, no fake sharing
    assert c[:16] != a[:16]
    # the same trace loads to the same tokens (blocks are seeded, not hash()-ed)
    again = load_mooncake(tmp_path / "trace.jsonl")
    assert [r.prompt_token_ids for r in again.requests] == [a, b, c, d]
    # a different block size changes where the prefixes end
    small = load_mooncake(tmp_path / "trace.jsonl", block_size=16)
    sa, sb = small.requests[0].prompt_token_ids, small.requests[1].prompt_token_ids
    assert sa is not None and sb is not None and sa[:32] == sb[:32] and sa[32:48] != sb[32:48]


def test_mooncake_rate_scale_and_limit(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "trace.jsonl", MOONCAKE_ROWS)
    fast = load_mooncake(path, rate_scale=2.0, max_requests=3)
    assert len(fast) == 3
    np.testing.assert_allclose(fast.arrivals(), [0.0, 0.0, 1.5])  # type: ignore[arg-type]
    assert "rate x2.0" in fast.source


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.6805901,396,109
2023-11-16 18:15:50.1234567,879,20
2023-11-16 18:15:50.1234567,120,0
"""


def test_azure_keeps_all_seven_fractional_digits(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE)
    w = load_azure(path)
    t = w.arrivals()
    assert t is not None
    assert t[0] == 0.0
    assert t[1] == pytest.approx(1e-7, abs=1e-12)  # one tick of the 7th digit
    assert t[2] == pytest.approx(3.4428667, abs=1e-12)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(374, 44), (396, 109), (879, 20)]
    # the zero-output row is left out and said so, under the file's own column name
    assert "1 of 4 rows dropped: GeneratedTokens 0" in w.source
    assert w.dropped == (("GeneratedTokens 0", 1),)
    assert all(r.prompt_token_ids is None for r in w.requests)  # no content in the trace
    assert w.requests[0].request_id == "azure-0"


def test_generic_csv_with_a_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("ts_ms,in,out,blocks,extra\n1000,20,5,1 2,x\n1500,30,6,1;3,y\n3000,8,7,,z\n")
    cols = {
        "timestamp": "ts_ms",
        "input_length": "in",
        "output_length": "out",
        "hash_ids": "blocks",
    }
    w = load_trace(path, cols, time_unit_s=0.001, block_size=4)
    np.testing.assert_allclose(w.arrivals(), [0.0, 0.5, 2.0])  # type: ignore[arg-type]
    a, b, c = (r.prompt_token_ids for r in w.requests)
    assert a is not None and b is not None and c is not None
    assert a[:4] == b[:4] and a[4:8] != b[4:8] and len(c) == 8
    slow = load_trace(path, cols, time_unit_s=0.001, time_scale=2.0)
    np.testing.assert_allclose(slow.arrivals(), [0.0, 1.0, 4.0])  # type: ignore[arg-type]


def test_generic_jsonl_with_prompt_text_and_no_timestamps(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"q": "what time does the shop open", "n": 12},
            {"q": "tell me a long story about a fish", "n": "30"},
        ],
    )
    w = load_trace(path, {"prompt": "q", "output_length": "n"})
    # approximate counter: ceil(len(word) / 4) per word ("story", "about": 2 each)
    assert [r.prompt_len for r in w.requests] == [6, 10]
    assert [r.output_len for r in w.requests] == [12, 30]
    assert w.requests[0].prompt_text == "what time does the shop open"
    assert list(w.arrivals()) == [0.0, 0.0]  # type: ignore[arg-type]


def test_generic_trace_reads_datetime_timestamps(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"t": "2024-05-10T00:00:59.5Z", "i": 5, "o": 5},
            {"t": "2024-05-10T00:01:00.25Z", "i": 5, "o": 5},
        ],
    )
    w = load_trace(path, {"timestamp": "t", "input_length": "i", "output_length": "o"})
    np.testing.assert_allclose(w.arrivals(), [0.0, 0.75])  # type: ignore[arg-type]
