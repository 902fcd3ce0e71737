"""Token ids a server accepts as ordinary prompt tokens, and the chat-length search.

Pure logic (files are read only by :func:`load_token_space`). A prompt of token ids has the
length of its list on every server: vLLM takes ``prompt: [ids]`` as is, adds no BOS and does
not re-tokenize. The ids must be ones the server's tokenizer holds as ordinary tokens:

- vLLM refuses an id above ``max(tokenizer's largest id, config.json vocab_size - 1)`` ("Token
  id N is out of vocabulary"), and rows of the embedding past the tokenizer's vocabulary
  (Qwen's padding to 151936, a test model's 2048 over a 1,902-token tokenizer) are untrained:
  the largest id worth sending is the tokenizer's largest *ordinary* id, which can be below
  ``vocab_size`` in ``config.json``;
- special ids (BOS, EOS, chat markers, image placeholders) change what a model does with a
  prompt, or are refused by multimodal models, so none is sent.

A workload stores ids drawn from ``[MIN_TOKEN_ID, vocab_size)`` of the model profile (its
fingerprint depends on them); :meth:`TokenSpace.map` sends id ``i`` as ``ordinary[i % n]``,
which keeps equal ids equal, so prompts that share a prefix still share one on the server.
See docs/loadgen.md#4-exact-prompt-lengths.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from autotune.workload.text import MIN_TOKEN_ID

__all__ = [
    "TokenSpace",
    "chat_tolerance",
    "load_token_space",
    "next_content_len",
    "ordinary_ids",
]

IntArray = npt.NDArray[np.int64]


class TokenSpace:
    """The sorted ids a prompt may use, and where that list came from (for messages)."""

    __slots__ = ("ids", "source")

    def __init__(self, ids: Iterable[int], source: str) -> None:
        arr = np.unique(np.fromiter(ids, dtype=np.int64))
        if arr.size == 0:
            raise ValueError(f"{source}: no ordinary token ids")
        self.ids: IntArray = arr
        self.source = source

    @classmethod
    def full(cls, vocab_size: int, source: str) -> TokenSpace:
        """Every id below ``vocab_size`` (the simulator: no special ids, ids in range are
        sent unchanged, so its prompts are exactly the workload's)."""
        return cls(range(vocab_size), source)

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def largest(self) -> int:
        return int(self.ids[-1])

    def map(self, ids: Sequence[int]) -> tuple[int, ...]:
        """Each id as ``ordinary[id % n]``: deterministic, equal ids stay equal."""
        if not ids:
            return ()
        arr = np.asarray(ids, dtype=np.int64)
        return tuple(self.ids[arr % self.ids.size].tolist())

    def __repr__(self) -> str:
        return f"TokenSpace({len(self)} ids up to {self.largest}, {self.source})"


def _vocab_ids(model: Any) -> list[int] | None:
    """Ids of a ``tokenizer.json`` model's vocabulary: BPE/WordPiece/WordLevel keep a
    ``{piece: id}`` map, Unigram a list of ``[piece, score]`` whose index is the id."""
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        return [int(i) for i in vocab.values() if isinstance(i, int)]
    if isinstance(vocab, list):
        return list(range(len(vocab)))
    return None


def ordinary_ids(tokenizer: dict[str, Any]) -> IntArray | None:
    """The ordinary ids of a parsed ``tokenizer.json``: the model's vocabulary without any
    added token (special or not: added tokens are chat markers and tool tags) and without
    ids below :data:`MIN_TOKEN_ID` (control tokens live there in many vocabularies).
    None when the file has no vocabulary this understands."""
    ids = _vocab_ids(tokenizer.get("model"))
    if not ids:
        return None
    added = {
        int(t["id"])
        for t in tokenizer.get("added_tokens") or ()
        if isinstance(t, dict) and isinstance(t.get("id"), int)
    }
    arr = np.unique(np.asarray(ids, dtype=np.int64))
    arr = arr[(arr >= MIN_TOKEN_ID) & ~np.isin(arr, np.fromiter(added, dtype=np.int64))]
    return arr if arr.size else None


def load_token_space(model_dir: str | Path) -> TokenSpace | None:
    """The ordinary ids of ``model_dir/tokenizer.json`` (plain JSON: no tokenizer package
    needed), or None when there is no such readable file."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ids = ordinary_ids(data) if isinstance(data, dict) else None
    return TokenSpace(ids.tolist(), f"{path}") if ids is not None else None


def chat_tolerance(target: int) -> int:
    """How far a built chat prompt may land from ``target`` tokens: max(1 %, 2 tokens)."""
    return max(2, math.floor(0.01 * target))


def next_content_len(
    target: int, overhead: int, probes: Sequence[tuple[int, int]], ratio: float
) -> int | None:
    """The next number of content ids to try for a chat prompt of ``target`` tokens.

    ``probes`` holds ``(content ids, counted tokens)`` pairs tried so far, ``overhead`` the
    chat template's own tokens and ``ratio`` the tokens one content id becomes on this server
    (its running estimate). The count grows with the number of ids but not exactly (ids merge
    or split when their text is tokenized again), so this steps by the local slope and keeps
    inside the bracket of the closest probes below and above the target. None when no untried
    length is left between them.
    """
    if not probes:
        return max(1, round((target - overhead) / max(ratio, 1e-3)))
    below = [p for p in probes if p[1] < target]
    above = [p for p in probes if p[1] > target]
    lo = max(below, default=None)
    hi = min(above, default=None)
    k, c = min(probes, key=lambda p: abs(p[1] - target))
    slope = (c - overhead) / k if k > 0 and c > overhead else ratio
    guess = k + round((target - c) / max(slope, 1e-3))
    floor = lo[0] + 1 if lo is not None else 1
    ceiling = hi[0] - 1 if hi is not None else None
    if ceiling is not None and floor > ceiling:
        return None
    guess = max(floor, guess if ceiling is None else min(ceiling, guess))
    tried = {p[0] for p in probes}
    if guess not in tried:
        return guess
    # step one id at a time towards the target inside the bracket
    step = 1 if c < target else -1
    nxt = k + step
    while nxt in tried:
        nxt += step
    if nxt < floor or (ceiling is not None and nxt > ceiling):
        return None
    return nxt
