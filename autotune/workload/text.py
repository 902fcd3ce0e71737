"""Prompt content without a tokenizer: token ids, text of a target length, hash-id blocks.

A prompt only has to have the right *length* and, for prefix caching, the right *sharing*;
its meaning never matters. So content is generated deterministically:

- token ids are drawn from ``[MIN_TOKEN_ID, vocab_size)`` with a seeded RNG. Low ids are
  skipped because many tokenizers put BOS/EOS/UNK there (Llama-2: 0, 1, 2);
- text is one common 4-letter English word per token. The target server's synthetic
  tokenizer counts one token per 4 characters of a word, and BPE tokenizers trained on English
  often hold " word" as one token, but other tokenizers make it several: this text is only the
  fallback for servers that cannot say (no ``/tokenize``); prompts are otherwise fitted to the
  server (docs/loadgen.md#4-exact-prompt-lengths). Text for token ids
  maps each id to a word, so identical id prefixes give identical text prefixes and prefix
  caching still works when a target only takes text;
- Mooncake ``hash_ids`` map to fixed blocks of ids, the same block for the same id wherever
  it appears, which is what turns shared hash prefixes into shared prompt prefixes.

Seeds go through ``np.random.default_rng`` with integer seed sequences, never Python's
``hash()``: that is salted per process (vLLM's ``timed_trace`` needs ``PYTHONHASHSEED``
pinned for this reason), and workloads must be identical across processes.
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from autotune.errors import ConfigError

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "MIN_TOKEN_ID",
    "MOONCAKE_BLOCK_SIZE",
    "WORDS",
    "HashBlockTokens",
    "TokenCounter",
    "approx_token_count",
    "hf_token_counter",
    "local_token_counter",
    "random_token_ids",
    "stable_seed",
    "text_for_token_ids",
    "text_of_length",
]

DEFAULT_VOCAB_SIZE = 32000  # the smallest common vocabulary (Llama-2, Mistral): ids valid for most
MIN_TOKEN_ID = 16
MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in the Mooncake traces (README, FAST'25 release)

# 256 common 4-letter words: each is one token for the synthetic tokenizer and, with its
# leading space, one token for common BPE vocabularies.
_WORD_LIST = """
that with have this will your from they know want been good much some time very
when come here just like long make many more only over such take than them well
were what also back call came each even find give hand high keep kind last left
life live look made most move must name need next open part play said same seem
show side tell turn used ways week went work year area best body book both case
city dark data days done door down draw easy else face fact fall fast feel felt
file fine fire form four free full game girl goes gone half hard head hear held
help hold home hope hour idea into item join land late lead less line list lost
love main mark mean meet mind miss near nice note once page paid past plan poor
pull push rate read real rest rich road rock role room rule safe sale save seen
sell send ship shop shot sign size slow soft sold song soon sort star stay step
stop sure talk team term test text then thus tiny told took tree true type unit
upon user view wait walk wall warm wear wide wife wind wish wood word wore yard
yeah able away baby bank base beat bill blue boat bond born busy card care cell
cold cost crew deal deep deny desk diet drop duty earn east edge ever exit farm
fear feed fish flat food foot fund gain gift goal gold grow hair hall hang hill
"""
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())

TokenCounter = Callable[[str], int]


def stable_seed(*parts: int | str) -> list[int]:
    """An RNG seed sequence from ints and strings, identical in every process."""
    # SeedSequence takes non-negative ints only: strings are hashed, ints wrapped to 64 bits
    return [
        int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little")
        if isinstance(p, str)
        else p & 0xFFFF_FFFF_FFFF_FFFF
        for p in parts
    ]


def random_token_ids(
    rng: np.random.Generator, n: int, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> tuple[int, ...]:
    """``n`` ids uniform over ``[MIN_TOKEN_ID, vocab_size)``."""
    _check_vocab(vocab_size)
    return tuple(rng.integers(MIN_TOKEN_ID, vocab_size, size=n).tolist())


def text_for_token_ids(ids: Sequence[int]) -> str:
    """One word per id; equal id prefixes give equal text prefixes."""
    return " ".join(WORDS[i % len(WORDS)] for i in ids)


def text_of_length(num_tokens: int, seed: int | str = 0) -> str:
    """Deterministic text of about ``num_tokens`` tokens (exactly that many words)."""
    rng = np.random.default_rng(stable_seed("text", seed))
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=num_tokens).tolist())


def approx_token_count(text: str) -> int:
    """Tokens by the synthetic rule: ``ceil(len(word) / 4)`` per whitespace-separated word.

    The default counter for ShareGPT when no tokenizer is given. English prose comes out
    within ~20 % of Llama tokenizers; the server's usage chunk has the real counts anyway.
    """
    return sum(math.ceil(len(w) / 4) for w in text.split())


def hf_token_counter(name_or_path: str) -> TokenCounter:
    """A counter from a *local* Hugging Face tokenizer (never downloads).

    Optional: ``transformers`` is not a dependency. Counts include special tokens (BOS), as
    vLLM's ShareGPT loader does.
    """
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise ConfigError(
            f"tokenizer '{name_or_path}': the transformers package is not installed "
            "(leave the tokenizer unset to use the approximate word count)"
        ) from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as e:  # transformers raises many types for "not found"
        raise ConfigError(
            f"tokenizer '{name_or_path}': cannot load it from local files: {e}"
        ) from None

    def count(text: str) -> int:
        return len(tok(text).input_ids)

    return count


def local_token_counter(model_dir: str | Path) -> TokenCounter | None:
    """A counter from ``model_dir/tokenizer.json`` with the ``tokenizers`` package (the
    optional extra ``autotune[tokenizers]``), or None when either is missing.

    Counts include the special tokens the tokenizer's post-processor adds (BOS), as vLLM's
    completions endpoint counts a text prompt; a chat template's tokens are not included
    (the server counts them at the first trial, docs/loadgen.md#43-text-datasets).
    """
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tokenizers = importlib.import_module("tokenizers")
    except ImportError:
        return None
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust binding raises a bare Exception for a bad file
        raise ConfigError(f"{path}: cannot load the tokenizer: {e}") from None

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=True).ids)

    return count


class HashBlockTokens:
    """Mooncake-style prompts: each hash id is a fixed block of ``block_size`` token ids.

    Blocks are memoised so identical hash ids share one tuple (and its int objects), which
    keeps a trace with heavy prefix sharing from multiplying memory.
    """

    def __init__(
        self,
        block_size: int = MOONCAKE_BLOCK_SIZE,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        seed: int = 0,
    ) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        _check_vocab(vocab_size)
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.seed = seed
        self._blocks: dict[int, tuple[int, ...]] = {}

    def block(self, hash_id: int) -> tuple[int, ...]:
        blk = self._blocks.get(hash_id)
        if blk is None:
            rng = np.random.default_rng(stable_seed("block", self.seed, hash_id))
            blk = random_token_ids(rng, self.block_size, self.vocab_size)
            self._blocks[hash_id] = blk
        return blk

    def prompt(self, hash_ids: Sequence[int], length: int, pad_seed: int | str) -> tuple[int, ...]:
        """``length`` ids: the hash blocks in order, cut at ``length``.

        Too few hash ids for ``length`` (vLLM would then send a *shorter* prompt) are padded
        with ids unique to ``pad_seed``: the trace's ``input_length`` is what the workload
        profile and the simulator must see, and a unique tail cannot fake cache hits.
        """
        ids: list[int] = []
        for h in hash_ids:
            if len(ids) >= length:
                break
            ids.extend(self.block(h))
        if len(ids) < length:
            rng = np.random.default_rng(stable_seed("pad", self.seed, pad_seed))
            ids.extend(random_token_ids(rng, length - len(ids), self.vocab_size))
        return tuple(ids[:length])


def _check_vocab(vocab_size: int) -> None:
    if vocab_size <= MIN_TOKEN_ID:
        raise ConfigError(f"vocab_size must be > {MIN_TOKEN_ID}, got {vocab_size}")
