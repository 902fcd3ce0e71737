"""The synthetic tokenizer: determinism, round trip, counts, ids in range, chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.sim.tokenizer import SyntheticTokenizer

LLAMA3_VOCAB = 128256
# Vocabulary sizes on either side of the syllable-count steps (70, 70**2, 70**3).
VOCABS = (1, 2, 70, 71, 4900, 4901, 32000, LLAMA3_VOCAB, 343000, 343001)
TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  tabs\tand\nnewlines  ",
    "naïve café ☕ 東京タワー",
    "banana bababa zozozo",
]


def test_golden_ids() -> None:
    # Pinned: a change here silently changes every simulated prompt's token ids and counts.
    tok = SyntheticTokenizer(LLAMA3_VOCAB)
    assert tok.encode("Hello world, banana!") == [89601, 44889, 62051, 48118, 89520, 26370]
    assert tok.encode("banana") == [2485]


def test_deterministic_across_processes() -> None:
    code = (
        "import json, sys; from autotune.sim.tokenizer import SyntheticTokenizer as T; "
        "t = T(int(sys.argv[1])); "
        "print(json.dumps([t.encode(s) for s in json.load(sys.stdin)]))"
    )
    here = [SyntheticTokenizer(LLAMA3_VOCAB).encode(s) for s in TEXTS]
    for seed in ("0", "12345"):  # Python's str hash differs per seed; ours must not
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(LLAMA3_VOCAB)],
            env=env,
            input=json.dumps(TEXTS),
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(out.stdout) == here


@given(st.data())
def test_round_trip(data: st.DataObject) -> None:
    vocab = data.draw(st.sampled_from(VOCABS))
    ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=50))
    tok = SyntheticTokenizer(vocab)
    text = tok.decode(ids)
    assert tok.encode(text) == ids
    assert tok.count(text) == len(ids)
    assert text == "".join(tok.token_text(i) for i in ids)


@pytest.mark.parametrize("vocab", VOCABS)
def test_round_trip_at_the_vocabulary_ends(vocab: int) -> None:
    tok = SyntheticTokenizer(vocab)
    ends = [0, vocab - 1, 0, vocab - 1]
    assert tok.encode(tok.decode(ends)) == ends
    assert len({tok.token_text(i) for i in {0, vocab - 1, vocab // 2}}) == len(
        {0, vocab - 1, vocab // 2}
    )


def test_token_text_and_range() -> None:
    tok = SyntheticTokenizer(LLAMA3_VOCAB)
    assert tok.token_text(0) == " bababa"
    assert tok.decode([]) == ""
    for bad in (-1, LLAMA3_VOCAB):
        with pytest.raises(ValueError, match="out of range"):
            tok.token_text(bad)
    with pytest.raises(ValueError):
        SyntheticTokenizer(0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("   \n\t ", 0),
        ("a", 1),
        ("Hello world", 4),  # 5 characters -> 2 tokens each
        ("The quick brown fox jumps over the lazy dog.", 12),
        ("internationalization", 5),  # 20 characters
        ("banana", 1),  # a vocabulary word when the vocabulary has 3-syllable words
        ("Banana", 2),  # vocabulary words are lowercase
    ],
)
def test_counts(text: str, expected: int) -> None:
    tok = SyntheticTokenizer(LLAMA3_VOCAB)
    assert tok.count(text) == expected == len(tok.encode(text))


def test_roughly_four_characters_per_token_on_english() -> None:
    text = (
        "Large language model serving systems batch requests together to use the GPU well, "
        "and the scheduler decides every step which requests run and how many of their "
        "prompt tokens are computed in that step."
    )
    assert 3.5 <= len(text) / SyntheticTokenizer(LLAMA3_VOCAB).count(text) <= 5.5


@given(st.sampled_from(VOCABS), st.text(max_size=200))
def test_ids_in_range_and_count_agrees(vocab: int, text: str) -> None:
    tok = SyntheticTokenizer(vocab)
    ids = tok.encode(text)
    assert all(0 <= i < vocab for i in ids)
    assert tok.count(text) == len(ids)


@given(st.text(max_size=100), st.text(max_size=100))
def test_shared_text_prefix_gives_shared_token_prefix(a: str, b: str) -> None:
    tok = SyntheticTokenizer(LLAMA3_VOCAB)
    head = tok.encode(a)
    assert tok.encode(a + " " + b)[: len(head)] == head


def test_chat_prompt() -> None:
    tok = SyntheticTokenizer(LLAMA3_VOCAB)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "there"},
            ],
        },
        {"role": "assistant", "content": None},
    ]
    expected = "<|system|>\nBe brief.\n<|user|>\nHi\nthere\n<|assistant|>\n\n<|assistant|>\n"
    assert tok.chat_prompt(messages) == expected
    assert tok.chat_prompt(messages[:1], add_generation_prompt=False) == "<|system|>\nBe brief.\n"
    # Tags: <|system|> 3, <|user|> 2, <|assistant|> 4 (twice); text: 1 + 2 + 1 + 2.
    assert tok.count(tok.chat_prompt(messages)) == 19
    malformed: list[list[Any]] = [
        [{"content": "no role"}],
        [{"role": "user", "content": 3}],
        ["text"],
    ]
    for bad in malformed:
        with pytest.raises(ValueError):
            tok.chat_prompt(bad)
