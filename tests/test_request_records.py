"""Per-request records (docs/loadgen.md#6-per-request-records): the requests-jsonl format and
its reader (autotune/loadgen/request_log.py), their table on both backends
(autotune/store/request_store.py), a study keeping them with ``record.requests``
(autotune/tuning/measure/trial.py) and ``study export --format requests-jsonl``
(autotune/report/request_export.py).

What is checked is that the records round-trip: what the load generator reads back from an
export gives the figures the level was stored with."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_main import run_main
from support.databases import BACKENDS, fresh_database, make_level, make_study, make_trial
from support.recorded_study import stored_trial
from support.studies import config

from autotune.errors import ConfigError, StorageError
from autotune.loadgen.bench_stats import RequestRecord, summarize
from autotune.loadgen.request_log import (
    VLLM_FIELDS,
    decode_requests,
    encode_requests,
    parse_requests,
    read_requests,
    requests_jsonl,
)
from autotune.profiles.hardware import get_hardware
from autotune.sim import replay_level, sim_engine_args
from autotune.store import RequestLog, Store, StudyRecord
from autotune.tuning.search.plan import model_of
from autotune.workload.build import build_workload

# the figures a level is scored and stored on, in the load generator's summary
FIGURES = ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "mean_ttft_ms")
NS_MS = 1e-6  # a nanosecond in ms: times are kept to the nanosecond


def export(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    """``autotune study export t ARGS``: (exit status, stdout, stderr)."""
    return run_main(["study", "export", "t", "--storage", url, *args], capsys)


def sim_records(n: int = 40) -> list[RequestRecord]:
    """The measured records of one simulated level, plus a failed and an over-length one."""
    cfg, _ = config(workload={"num_prompts": n, "output_len": 32})
    level = replay_level(
        model_of(cfg),
        get_hardware(cfg.hardware),
        sim_engine_args({"max_num_seqs": 16}, {}),
        build_workload(cfg.workload),
        seed=3,
        jitter_cv=0.05,
    )
    failed = RequestRecord(
        request_id="x", error="stall: no data", http_status=200, prompt_len=9, output_tokens=3,
        scheduled_at=0.5, sent_at=0.625, first_token_at=0.7, finished_at=2.0, itl=[0.01, 0.02],
    )  # fmt: skip
    over = RequestRecord(
        request_id="y", error="over_length: too long", http_status=400, prompt_len=9000,
        scheduled_at=1.0, sent_at=1.0, finished_at=1.01, over_length=True,
    )  # fmt: skip
    return [*level.records, failed, over]


def same_figures(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in FIGURES:
        assert a[key] == pytest.approx(b[key], abs=NS_MS), key
    for key in ("completed", "failed", "total_output_tokens", "over_length_rejections"):
        assert a[key] == b[key], key


def test_records_read_back_give_the_figures_they_were_scored_on(tmp_path: Path) -> None:
    recs = sim_records()
    stored = summarize(recs, 30.0)
    log = encode_requests(recs)
    assert log.requests == len(recs) and log.raw_bytes > len(log.data) > 0
    back = parse_requests(decode_requests(log.data))
    same_figures(summarize(back, 30.0), stored)
    # field by field: what the records were, to the nanosecond
    for got, want in zip(back, recs, strict=True):
        assert (got.request_id, got.success, got.error) == (
            want.request_id,
            want.success,
            want.error,
        )
        assert (got.output_tokens, got.prompt_len, got.over_length) == (
            want.output_tokens,
            want.prompt_len,
            want.over_length,
        )
        assert got.ttft == pytest.approx(want.ttft, abs=1e-9)
        assert got.itl == pytest.approx(want.itl, abs=1e-9)
    # each line starts with vLLM's --save-detailed fields, in their order
    first = json.loads(decode_requests(log.data).splitlines()[0])
    assert tuple(first)[: len(VLLM_FIELDS)] == VLLM_FIELDS
    # the file reader: plain and gzip-compressed
    plain, packed = tmp_path / "r.jsonl", tmp_path / "r.jsonl.gz"
    plain.write_text(requests_jsonl(recs))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_requests(plain) == read_requests(packed) == back


def test_a_line_of_vllm_fields_alone_is_a_record() -> None:
    line = {
        "input_len": 100, "output_len": 3, "start_time": 2.0, "ttft": 0.5, "itl": [0.1, 0.2],
        "latency": 0.8, "queue_time": 0.25, "generated_text": "", "error": "",
    }  # fmt: skip
    (r,) = parse_requests(json.dumps(line) + "\n\n")
    assert r.success and r.prompt_len == r.input_tokens == 100 and r.output_tokens == 3
    assert r.scheduled_at == 1.75 and r.first_token_at == 2.5 and r.finished_at == 2.8
    assert r.tpot == pytest.approx(0.15)
    (bad,) = parse_requests(json.dumps(line | {"error": "http_500: boom", "ttft": None}))
    assert not bad.success and bad.ttft is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"input_len": 1}', "r.jsonl:1: field 'output_len' is missing"),
        ("[1]", "r.jsonl:1: a line must be a JSON object"),
        ("{", "r.jsonl:1: malformed JSON"),
        ('{"input_len":1,"output_len":2,"ttft":"x","itl":[],"latency":1,"error":""}', "'ttft'"),
        ('{"input_len":1,"output_len":2,"ttft":1,"itl":[true],"latency":1,"error":""}', "'itl'"),
        (
            '{"input_len":1,"output_len":null,"ttft":1,"itl":[],"latency":1,"error":""}',
            "'output_len'",
        ),
    ],
)
def test_a_bad_line_is_one_line_naming_it(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_requests(text, "r.jsonl")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as fresh:
        yield fresh


def test_the_store_keeps_a_levels_records_until_its_study_goes(url: str) -> None:
    log = encode_requests(sim_records(8))
    with Store.open(url, upgrade=True) as store:
        store.create_study(make_study("s"))
        store.add_trial(make_trial("s", 0))
        ids = [lv.id for lv in store.trials("s")[0].levels]
        assert ids[0] is not None and ids[1] is not None
        store.add_requests(ids[0], log)
        assert store.level_requests(ids[0]) == log
        assert store.level_requests(ids[1]) is None  # a level that kept none
        with pytest.raises(StorageError, match="already has its per-request records"):
            store.add_requests(ids[0], log)
        with pytest.raises(StorageError, match="does not exist"):
            store.add_requests(10_000, log)
        store.delete_study("s")  # the database's cascade takes the records along
        assert store.level_requests(ids[0]) is None


@pytest.mark.config_field("record.requests")
def test_a_study_keeps_each_levels_records_and_exports_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, levels = asyncio.run(stored_trial(tmp_path, keep=True))
    # default: the recommended trial's capacity level, as `study show` reports it
    top = max((lv for lv in levels.values() if lv.feasible), key=lambda lv: lv.scale)
    out = tmp_path / "top.jsonl.gz"  # a .gz name: written compressed, read back as such
    assert export(capsys, url, "--format", "requests-jsonl", "--out", str(out))[0] == 0
    back = summarize(read_requests(out), 1.0)
    assert back["completed"] == top.completed and back["failed"] == top.failed
    assert back["p99_ttft_ms"] == pytest.approx(top.p99_ttft_ms, abs=NS_MS)
    assert back["p99_tpot_ms"] == pytest.approx(top.p99_tpot_ms, abs=NS_MS)
    assert back["p99_itl_ms"] == pytest.approx(top.p99_itl_ms, abs=NS_MS)
    # any level by its index, to stdout; every level, one file each in a folder
    low = min(levels)
    code, text, _ = export(capsys, url, "--format", "requests-jsonl", "--trial", "0",
                           "--level", str(low))  # fmt: skip
    assert code == 0
    assert len(parse_requests(text)) == levels[low].completed + levels[low].failed
    folder = tmp_path / "all"
    code, _, _ = export(capsys, url, "--format", "requests-jsonl", "--level", "all",
                        "--out", str(folder))  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        f"trial-0-level-{k}.jsonl" for k in sorted(levels)
    ]
    for k, lv in levels.items():  # every measured request of every level was kept
        assert len(read_requests(folder / f"trial-0-level-{k}.jsonl")) == lv.completed + lv.failed


@pytest.mark.config_field("record.requests")
def test_without_records_the_export_says_how_to_keep_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = asyncio.run(stored_trial(tmp_path, keep=False))
    code, out, err = export(capsys, url, "--format", "requests-jsonl")
    assert code == 4 and out == ""
    line = err.strip()
    assert "kept no per-request records (record.requests is off)" in line
    assert "record: {requests: true}" in line and "\n" not in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--level", "x"], "--level must be a level's index (0, 1, ...) or all, not 'x'"),
        (["--trial", "7"], "--trial: study 't' has no trial 7 (its trials: 0)"),
        (["--level", "9"], "--level: trial 0 has no level 9"),
        (["--level", "all"], "--level all writes one file per level: give --out FOLDER"),
    ],
)
def test_a_bad_choice_of_level_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    cfg, text = config(record={"requests": True})
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Store.open(url) as store:
        store.create_study(StudyRecord("t", text, {}, cfg.mode, "sim-virtual", "optuna-t"))
        lvl = make_level(0, feasible=True)
        store.add_trial(
            make_trial("t", 0, [lvl, make_level(1)], state="COMPLETE", feasible=True, objective=1.0)
        )
        (lv0, lv1) = store.trials("t")[0].levels
        for lv in (lv0, lv1):
            store.add_requests(lv.id or -1, RequestLog(0, 0, gzip.compress(b"")))
    code, _, err = export(capsys, url, "--format", "requests-jsonl", *args)
    assert code in (1, 4) and words in err and err.count("\n") == 1, err


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "r.jsonl.gz"
    broken.write_bytes(b"not gzip")
    for path, words in ((tmp_path / "none.jsonl", "no such file"), (broken, "cannot read")):
        with pytest.raises(ConfigError) as err:
            read_requests(path)
        assert str(err.value).startswith(f"{path}: {words}") and "\n" not in str(err.value)
