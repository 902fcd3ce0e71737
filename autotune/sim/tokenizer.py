"""A deterministic synthetic tokenizer for the simulated vLLM server.

The simulator has no model weights and no Hugging Face tokenizer, yet its server must count
prompt tokens in text, answer ``/tokenize`` and ``/detokenize``, and stream text for generated
token ids. This tokenizer does all three with no data files, identically in every process.

Encoding: the text is split on whitespace. A word of the reserved *vocabulary shape* (below)
is one token, its vocabulary id. Any other word of ``n`` characters is ``max(1, ceil(n/4))``
tokens: roughly one per 4 characters, as real BPE tokenizers give on ordinary English. Those
ids come from BLAKE2b of each 4-character chunk (never Python's ``hash()``, which is salted per
process), so equal words give equal ids and prompts that share a text prefix share a token
prefix, which the simulated prefix cache needs.

Vocabulary: id ``i`` is the lowercase pseudo-word spelling ``i`` in base 70 with a fixed number
``L`` of consonant-vowel syllables (70 = 14 consonants x 5 vowels; ``L`` is the least with
``70**L >= vocab_size``, so 3 syllables for Llama-3's 128256). The encoder checks this shape
before hashing, so ``encode(decode(ids)) == ids`` for every id list. An ordinary word that
happens to have the shape ("banana" with L = 3) is that vocabulary token: deterministic, and one
token where the 4-character rule would say two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SyntheticTokenizer"]

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)
_SYLLABLE_INDEX = {s: i for i, s in enumerate(_SYLLABLES)}
_BASE = len(_SYLLABLES)
_CHUNK = 4  # characters per hashed token
_CACHE_LIMIT = 1 << 18  # words memoized per tokenizer before the memo is dropped


class SyntheticTokenizer:
    """Whitespace-word tokenizer with a reserved, round-trippable vocabulary (module doc)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self._syllables = 1
        while _BASE**self._syllables < vocab_size:
            self._syllables += 1
        self._word_len = 2 * self._syllables
        # Memo of hashed words: prompts repeat words a lot, and BLAKE2b per chunk is the cost.
        self._memo: dict[str, tuple[int, ...]] = {}

    # -- vocabulary words --------------------------------------------------------------------

    def _vocab_word(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
        syllables = []
        for _ in range(self._syllables):
            token_id, digit = divmod(token_id, _BASE)
            syllables.append(_SYLLABLES[digit])
        return "".join(reversed(syllables))

    def _vocab_id(self, word: str) -> int | None:
        """The id of a vocabulary-shaped word, else None (the word is hashed)."""
        if len(word) != self._word_len:
            return None
        value = 0
        for start in range(0, self._word_len, 2):
            digit = _SYLLABLE_INDEX.get(word[start : start + 2])
            if digit is None:
                return None
            value = value * _BASE + digit
        return value if value < self.vocab_size else None

    # -- encoding -----------------------------------------------------------------------------

    def _hashed(self, word: str) -> tuple[int, ...]:
        ids = self._memo.get(word)
        if ids is None:
            out = []
            for start in range(0, len(word), _CHUNK):
                # The word-start marker keeps "abcd" apart from the "abcd" inside "xyzwabcd",
                # as BPE tells a word-initial piece from a continuation.
                piece = ("\x00" if start == 0 else "\x01") + word[start : start + _CHUNK]
                digest = hashlib.blake2b(
                    piece.encode("utf-8", "surrogatepass"), digest_size=8
                ).digest()
                out.append(int.from_bytes(digest, "big") % self.vocab_size)
            ids = tuple(out)
            if len(self._memo) >= _CACHE_LIMIT:
                self._memo.clear()
            self._memo[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (deterministic across processes and runs)."""
        ids: list[int] = []
        for word in text.split():
            vocab_id = self._vocab_id(word)
            if vocab_id is not None:
                ids.append(vocab_id)
            else:
                ids.extend(self._hashed(word))
        return ids

    def count(self, text: str) -> int:
        """``len(encode(text))``, without hashing anything."""
        total = 0
        for word in text.split():
            if self._vocab_id(word) is not None:
                total += 1
            else:
                total += -(-len(word) // _CHUNK)  # ceil; a split() word is never empty
        return total

    # -- decoding -----------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The text one token streams as: a space, then its vocabulary word."""
        return " " + self._vocab_word(token_id)

    def decode(self, ids: Sequence[int]) -> str:
        """The concatenated :meth:`token_text` of ``ids``.

        The leading space is kept (unlike sentencepiece's decode of a first token) so a
        non-streamed completion equals the concatenation of its streamed deltas.
        """
        return "".join(self.token_text(i) for i in ids)

    # -- chat ---------------------------------------------------------------------------------

    def chat_prompt(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """Render OpenAI-style chat messages as one prompt string.

        Template: each message becomes ``<|ROLE|>\\nCONTENT\\n``; then, with
        ``add_generation_prompt`` (vLLM's default), ``<|assistant|>\\n``. ``content`` may be a
        string, None, or a list of parts whose ``text`` parts are joined with newlines (other
        parts, e.g. images, contribute nothing). Raises ValueError for a malformed message, for
        the server to answer 400 as vLLM does.
        """
        rendered: list[str] = []
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{index}] must be an object with a string 'role'")
            rendered.append(f"<|{message['role']}|>\n{_content_text(message.get('content'))}\n")
        if add_generation_prompt:
            rendered.append("<|assistant|>\n")
        return "".join(rendered)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part["text"])
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text" and "text" in part
        )
    raise ValueError("message content must be a string, a list of parts or null")
