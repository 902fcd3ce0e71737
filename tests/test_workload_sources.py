"""Workload sources: ShareGPT sampling (vLLM's rules), vLLM random, synthetic lengths, text."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from autotune.errors import ConfigError
from autotune.sim import sim_request
from autotune.workload import (
    Empirical,
    Fixed,
    LogNormal,
    Uniform,
    WorkloadRequest,
    approx_token_count,
    hf_token_counter,
    is_valid_sequence,
    load_sharegpt,
    random_workload,
    sharegpt_like_workload,
    synthetic_workload,
    text_of_length,
)
from autotune.workload.text import MIN_TOKEN_ID, WORDS, text_for_token_ids


def words(n: int) -> str:
    """Text of exactly n tokens by the approximate counter (n four-letter words)."""
    return " ".join(["word"] * n)


def conv(prompt_tokens: int, output_tokens: int, tag: str = "") -> dict[str, object]:
    prompt = (tag + " " + words(prompt_tokens - 1)).strip() if tag else words(prompt_tokens)
    return {
        "id": tag,
        "conversations": [
            {"from": "human", "value": prompt},
            {"from": "gpt", "value": words(output_tokens)},
        ],
    }


def write_sharegpt(tmp_path: Path, entries: list[object]) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries, indent=1))
    return path


def valid_entries(k: int) -> list[object]:
    return [conv(10 + i, 20 + i, tag=f"ok{i:02d}") for i in range(k)]


def test_sharegpt_applies_vllms_filter(tmp_path: Path) -> None:
    dropped: list[object] = [
        {"conversations": [{"from": "human", "value": words(50)}]},  # one turn
        {"id": "no conversations"},
        conv(3, 50),  # prompt < 4 tokens
        conv(50, 3),  # output < 4 tokens
        conv(1025, 10),  # prompt > 1024
        conv(1000, 1049),  # prompt + output > 2048
    ]
    kept = [conv(4, 4, "a"), conv(1024, 1024, "b"), conv(100, 200, "c")]  # the edges pass
    path = write_sharegpt(tmp_path, dropped + kept)
    w = load_sharegpt(path, 3, shuffle=False)
    got = [(r.prompt_len, r.output_len) for r in w.requests]
    assert got == [(4, 4), (1024, 1024), (100, 200)]
    assert [str(r.prompt_text).split()[0] for r in w.requests] == ["a", "b", "c"]
    assert all(r.arrival == 0.0 and r.prompt_token_ids is None for r in w.requests)
    assert is_valid_sequence(4, 4) and not is_valid_sequence(4, 3)


def test_sharegpt_fixed_output_len_skips_the_output_check(tmp_path: Path) -> None:
    path = write_sharegpt(tmp_path, [conv(50, 1, "shrt"), conv(50, 60, "x")])
    w = load_sharegpt(path, 2, shuffle=False, output_len=7)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(50, 7), (50, 7)]


def test_sharegpt_oversamples_when_fewer_pass(tmp_path: Path) -> None:
    path = write_sharegpt(tmp_path, [*valid_entries(3), conv(2, 2)])
    w = load_sharegpt(path, 10, seed=5)
    assert len(w) == 10
    texts = {r.prompt_text for r in w.requests}
    assert len(texts) == 3  # copies of the three survivors only
    assert len({r.request_id for r in w.requests}) == 10
    assert "7 oversampled" in w.source
    # the extra draws follow vLLM: random.seed(seed) again, then random.choice
    rng = random.Random(5)
    expect = [rng.choice(w.requests[:3]).prompt_text for _ in range(7)]
    assert [r.prompt_text for r in w.requests[3:]] == expect
    assert len(load_sharegpt(path, 10, oversample=False)) == 3


def test_sharegpt_shuffle_is_seeded_like_vllm(tmp_path: Path) -> None:
    entries = valid_entries(30)
    path = write_sharegpt(tmp_path, entries)

    def order(seed: int) -> list[str]:
        return [str(r.prompt_text).split()[0] for r in load_sharegpt(path, 30, seed=seed).requests]

    assert order(1) == order(1)
    assert order(1) != order(2)
    ref = [f"ok{i:02d}" for i in range(30)]
    random.Random(1).shuffle(ref)  # vLLM: random.seed(seed); random.shuffle(data)
    assert order(1) == ref
    unshuffled = load_sharegpt(path, 30, shuffle=False)
    assert [str(r.prompt_text).split()[0] for r in unshuffled.requests] == sorted(ref)


def test_sharegpt_uses_a_given_token_counter(tmp_path: Path) -> None:
    path = write_sharegpt(tmp_path, valid_entries(2))
    w = load_sharegpt(path, 2, shuffle=False, count_tokens=lambda s: len(s) // 2 + 1)
    assert w.requests[0].prompt_len == len(str(w.requests[0].prompt_text)) // 2 + 1


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is not None, reason="transformers is installed"
)
def test_hf_tokenizer_is_optional() -> None:
    with pytest.raises(ConfigError, match="transformers package is not installed"):
        hf_token_counter("meta-llama/Llama-3.1-8B-Instruct")


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.9])
def test_random_lengths_stay_in_vllms_ranges(ratio: float) -> None:
    w = random_workload(500, input_len=200, output_len=50, range_ratio=ratio, seed=3)
    p = np.array([r.prompt_len for r in w.requests])
    o = np.array([r.output_len for r in w.requests])
    assert p.min() >= math.floor(200 * (1 - ratio)) and p.max() <= math.ceil(200 * (1 + ratio))
    assert o.min() >= max(1, math.floor(50 * (1 - ratio)))
    assert o.max() <= math.ceil(50 * (1 + ratio))
    if ratio == 0.0:
        assert set(p) == {200} and set(o) == {50}
    else:  # both ends are reachable: the range is not silently narrower
        assert p.max() - p.min() > 200 * ratio


def test_random_prompts_follow_vllms_construction() -> None:
    w = random_workload(20, input_len=64, output_len=8, prefix_len=16, seed=0, vocab_size=1000)
    prefix = w.requests[0].prompt_token_ids[:16]  # type: ignore[index]
    allowed = 1000 - MIN_TOKEN_ID
    for r in w.requests:
        ids = r.prompt_token_ids
        assert ids is not None and len(ids) == r.prompt_len == 16 + 64
        assert ids[:16] == prefix  # one shared random prefix
        assert all(MIN_TOKEN_ID <= t < 1000 for t in ids)
        inner = [t - MIN_TOKEN_ID for t in ids[16:]]  # consecutive allowed ids, wrapping
        assert all((b - a) % allowed == 1 for a, b in itertools.pairwise(inner))
    assert random_workload(20, seed=0).requests == random_workload(20, seed=0).requests
    assert random_workload(5, input_len=10, num_special_tokens=1).requests[0].prompt_len == 9


def test_random_rejects_vllms_bad_arguments() -> None:
    with pytest.raises(ConfigError, match=r"range_ratio must be in \[0, 1\)"):
        random_workload(4, range_ratio=1.0)
    with pytest.raises(ConfigError, match="too small"):
        random_workload(4, input_len=1, num_special_tokens=1)


def test_synthetic_distributions_are_seeded_and_shaped() -> None:
    w = synthetic_workload(4000, LogNormal(mean=300, sigma=0.6), Uniform(10, 20), seed=1)
    p = np.array([r.prompt_len for r in w.requests])
    o = np.array([r.output_len for r in w.requests])
    assert p.mean() == pytest.approx(300, rel=0.05)
    assert o.min() >= 10 and o.max() <= 20
    again = synthetic_workload(4000, LogNormal(mean=300, sigma=0.6), Uniform(10, 20), seed=1)
    assert again.requests == w.requests
    f = synthetic_workload(3, Fixed(7), Empirical((5, 6)), seed=0)
    assert {r.prompt_len for r in f.requests} == {7}
    assert {r.output_len for r in f.requests} <= {5, 6}
    assert (
        LogNormal(mean=50, sigma=2.0, low=4, high=60).sample(np.random.default_rng(0), 1000).max()
        <= 60
    )


def test_sharegpt_like_profile_passes_the_filter_with_sharegpt_scale_means() -> None:
    w = sharegpt_like_workload(2000, seed=0)
    assert len(w) == 2000
    assert all(is_valid_sequence(r.prompt_len, r.output_len) for r in w.requests)
    prof = w.profile()
    assert 180 < prof.prompt_len.mean < 250 and 170 < prof.output_len.mean < 230
    assert prof.prompt_len.p50 < prof.prompt_len.mean  # long tail, as in ShareGPT
    again = sharegpt_like_workload(50, seed=4)
    assert again.requests == sharegpt_like_workload(50, seed=4).requests


def test_text_has_the_target_length_and_keeps_prefixes() -> None:
    text = text_of_length(300, seed=9)
    assert approx_token_count(text) == 300 and len(text.split()) == 300
    assert all(len(word) == 4 for word in WORDS) and len(set(WORDS)) == 256
    assert text_of_length(300, seed=9) == text != text_of_length(300, seed=10)
    a, b = text_for_token_ids([5, 6, 7, 8]), text_for_token_ids([5, 6, 7, 9])
    assert a.rsplit(" ", 1)[0] == b.rsplit(" ", 1)[0] and a != b


def test_request_prompt_forms() -> None:
    ids = WorkloadRequest(4, 2, prompt_token_ids=(20, 21, 22, 23), request_id="a")
    assert ids.prompt(accepts_token_ids=True) == [20, 21, 22, 23]
    assert ids.prompt(accepts_token_ids=False) == text_for_token_ids((20, 21, 22, 23))
    text = WorkloadRequest(3, 2, prompt_text="some real text", request_id="b")
    assert text.prompt(True) == text.prompt(False) == "some real text"
    bare = WorkloadRequest(50, 2, request_id="c")
    generated = bare.prompt(True)
    assert isinstance(generated, list) and len(generated) == 50
    assert bare.prompt(True) == generated  # deterministic per request id
    assert WorkloadRequest(50, 2, request_id="d").prompt(True) != generated
    assert approx_token_count(str(bare.prompt(False))) == 50
    sim = sim_request(ids)
    assert (sim.prompt_len, sim.output_len, sim.arrival, sim.request_id) == (4, 2, 0.0, "a")
    assert list(sim.prompt_token_ids or ()) == [20, 21, 22, 23]
    with pytest.raises(ValueError, match="prompt_len"):
        WorkloadRequest(3, 2, prompt_token_ids=(1, 2))
