"""Prompts of the requested length on the server at hand (docs/loadgen.md#4-exact-prompt-lengths).

- Completions: token-id prompts for every server (exact by construction), in the server's
  :class:`~autotune.workload.token_space.TokenSpace`: the simulator's whole vocabulary, else the
  ordinary ids of the model folder's ``tokenizer.json`` (the server's ``/v1/models`` root, or
  the folder the study names), else the ids ``/tokenize`` gives for a probe text.
- Chat (text only): each prompt is built through the server's ``/detokenize`` and
  ``/tokenize``: content ids become text, the whole chat prompt (template included, as the
  server counts ``usage.prompt_tokens``) is counted, and the number of ids is adjusted until
  the count is within max(1 %, 2 tokens) of the requested length.
- Given text (ShareGPT, traces with a prompt column) is sent unchanged and counted with
  ``/tokenize``: those counts become the requests' lengths.

Everything learned is cached per server and model (:func:`server_tokens`), so a study
calibrates once, at its first trial, whatever the number of trials and load levels.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from autotune.loadgen.payload import Endpoint
from autotune.loadgen.probe import ServerInfo
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import WORDS, random_token_ids, stable_seed
from autotune.workload.token_space import (
    TokenSpace,
    chat_tolerance,
    load_token_space,
    next_content_len,
)

__all__ = ["Calibration", "ServerTokens", "clear_cache", "prepare_for_server", "server_tokens"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
_PARALLEL = 8  # calibration requests in flight
_MAX_PROBES = 12  # detokenize/tokenize rounds per chat prompt
_MORE_CHUNK = 256  # content ids beyond a request's own come in seeded chunks of this size
# A probe text for servers whose tokenizer file is not at hand: common words, digits,
# punctuation and mixed case give a few hundred ordinary ids on any vocabulary.
_PROBE_TEXT = (
    " ".join(WORDS)
    + " "
    + " ".join(w.capitalize() for w in WORDS[::3])
    + " 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 . , ; : ! ? ( ) - ' \" / % $ & * + = @ #"
)


@dataclass
class Calibration:
    """What one server and model taught us (shared by every trial of a study)."""

    space: TokenSpace | None = None
    tokenize: bool = True  # False once the server proved to have no /tokenize
    chat_overhead: int | None = None
    tokens_per_id: float = 1.0  # running estimate for the first guess of a chat prompt
    chat: dict[tuple[str, int, str], tuple[str, int]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)


_CACHE: dict[tuple[str, str | None, str | None, int | None], Calibration] = {}


def clear_cache() -> None:
    """Forget every calibration (tests; a server whose tokenizer changed under a name)."""
    _CACHE.clear()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ServerTokens:
    """The calibration of one server, and the calls that build it."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        info: ServerInfo,
        cal: Calibration,
        *,
        model: str,
        api_key: str | None,
    ) -> None:
        self.session, self.info, self.cal = session, info, cal
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sem = asyncio.Semaphore(_PARALLEL)

    @property
    def space(self) -> TokenSpace | None:
        return self.cal.space

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer, or None when the server has no such endpoint, refuses, or cannot
        be reached (a worker that died: the level that follows notices)."""
        try:
            async with (
                self._sem,
                self.session.post(
                    self.info.base_url + path,
                    json={"model": self.model, **body},
                    headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S),
                ) as resp,
            ):
                if resp.status != 200:
                    if resp.status in (404, 405):
                        self.cal.tokenize = False
                    return None
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def tokenize(self, body: dict[str, Any]) -> list[int] | None:
        if not self.cal.tokenize:
            return None
        data = await self._post("/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return tokens
        return None

    async def count(self, text: str, endpoint: Endpoint) -> int | None:
        """What the server counts for ``text`` sent to ``endpoint`` (``usage.prompt_tokens``):
        completions add BOS as ``/tokenize`` does by default; chat renders the template."""
        key = (endpoint, _digest(text))
        if key in self.cal.counts:
            return self.cal.counts[key]
        body: dict[str, Any] = (
            {"messages": [{"role": "user", "content": text}]}
            if endpoint == "chat"
            else {"prompt": text}
        )
        ids = await self.tokenize(body)
        if ids is None:
            return None
        self.cal.counts[key] = len(ids)
        return len(ids)

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        data = await self._post("/detokenize", {"tokens": list(ids)})
        text = data.get("prompt") if isinstance(data, dict) else None
        return text if isinstance(text, str) else None

    async def chat_overhead(self) -> int | None:
        """The chat template's own tokens: the count of a chat prompt with empty content."""
        if self.cal.chat_overhead is None:
            self.cal.chat_overhead = await self.count("", "chat")
        return self.cal.chat_overhead

    async def chat_text(
        self, target: int, content_ids: Callable[[int], Sequence[int]]
    ) -> tuple[str, int] | None:
        """Text whose chat prompt counts ``target`` tokens within :func:`chat_tolerance`
        (or the closest found), and its count; None when the server cannot tell."""
        overhead = await self.chat_overhead()
        space = self.cal.space
        if overhead is None or space is None:
            return None
        tol = chat_tolerance(target)
        probes: list[tuple[int, int]] = []
        texts: dict[int, str] = {}
        for _ in range(_MAX_PROBES):
            k = next_content_len(target, overhead, probes, self.cal.tokens_per_id)
            if k is None:
                break
            text = await self.detokenize(space.map(content_ids(k)))
            count = await self.count(text, "chat") if text is not None else None
            if text is None or count is None:
                return None
            probes.append((k, count))
            texts[k] = text
            if abs(count - target) <= tol:
                break
        k, count = min(probes, key=lambda p: (abs(p[1] - target), p[0]))
        if count > overhead:  # learn for the next prompt's first guess
            seen = (count - overhead) / k
            self.cal.tokens_per_id = 0.7 * self.cal.tokens_per_id + 0.3 * seen
        if abs(count - target) <= tol:
            return texts[k], count
        # One id is more tokens than the tolerance (a character-level tokenizer spells a
        # word as several): cut the shortest text that is too long at a character.
        over = [p for p in probes if p[1] > target]
        under = [p for p in probes if p[1] < target]
        if not over:
            return texts[k], count
        k_hi = min(over)[0]
        text = texts[k_hi]
        k_lo = max(under)[0] if under else None
        lo = len(texts[k_lo]) if k_lo is not None and text.startswith(texts[k_lo]) else 0
        best = (texts[k], count)
        hi = len(text)
        for _ in range(_MAX_PROBES):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            c = await self.count(text[:mid], "chat")
            if c is None:
                break
            if abs(c - target) < abs(best[1] - target):
                best = (text[:mid], c)
            if abs(c - target) <= tol:
                break
            lo, hi = (mid, hi) if c < target else (lo, mid)
        return best


def _local_dir(path: str | None) -> Path | None:
    if not path:
        return None
    p = Path(path)
    return p if p.is_dir() else None


async def server_tokens(
    session: aiohttp.ClientSession,
    info: ServerInfo,
    *,
    model: str | None = None,
    api_key: str | None = None,
    model_dir: str | Path | None = None,
) -> ServerTokens:
    """The server's calibration, from the cache when this server and model were seen.

    The token space: the simulator's vocabulary; else the ordinary ids of ``tokenizer.json``
    in the server's model folder (``/v1/models`` root) or in ``model_dir``; else the ids
    ``/tokenize`` gives for a probe text; else None (the server cannot be asked: prompts
    fall back to text of about the right length).
    """
    name = model or info.model_id
    key = (name, info.root, info.version, info.vocab_size if info.simulated else None)
    cal = _CACHE.setdefault(key, Calibration())
    tokens = ServerTokens(session, info, cal, model=name, api_key=api_key)
    if cal.space is None and cal.tokenize:
        cal.space = await _find_space(tokens, info, model_dir)
    return tokens


async def _find_space(
    tokens: ServerTokens, info: ServerInfo, model_dir: str | Path | None
) -> TokenSpace | None:
    if info.simulated and info.vocab_size:
        return TokenSpace.full(info.vocab_size, "the simulated server's vocabulary")
    for folder in (_local_dir(info.root), _local_dir(str(model_dir) if model_dir else None)):
        if folder is not None and (space := load_token_space(folder)) is not None:
            return space
    ids = await tokens.tokenize({"prompt": _PROBE_TEXT, "add_special_tokens": False})
    if ids:
        return TokenSpace(ids, "ids the server's /tokenize gave for a probe text")
    return None


def _text(r: WorkloadRequest, vocab_size: int) -> str:
    """Text of about ``prompt_len`` tokens without the server's help (one word per token)."""
    text = r.prompt(False, vocab_size)
    assert isinstance(text, str)
    return text


def _content_ids(r: WorkloadRequest, vocab_size: int) -> Callable[[int], list[int]]:
    """The first ``k`` content ids of ``r``: its token-id prompt (stored, or the one sent to
    the completions endpoint), continued with ids seeded by its id when ``k`` is longer."""
    ids = r.prompt(True, vocab_size)
    assert isinstance(ids, list)

    def first(k: int) -> list[int]:
        while len(ids) < k:  # fixed-size chunks: the same ids whatever was asked before
            chunk = len(ids) // _MORE_CHUNK
            rng = np.random.default_rng(stable_seed("prompt-more", r.request_id, chunk))
            ids.extend(random_token_ids(rng, _MORE_CHUNK - len(ids) % _MORE_CHUNK, vocab_size))
        return ids[:k]

    return first


async def _prepare_one(
    r: WorkloadRequest,
    tokens: ServerTokens,
    endpoint: Endpoint,
    vocab_size: int,
    fallback: list[str],
) -> WorkloadRequest:
    space = tokens.space
    if r.prompt_text is not None:  # given text: sent as is, counted by the server
        n = await tokens.count(r.prompt_text, endpoint)
        if n is None:
            fallback.append("the server cannot count text prompts (no /tokenize)")
            return r
        return replace(r, prompt_len=n) if n > 0 else r
    if endpoint == "completions":
        if space is None:
            fallback.append("no token ids known for this server (no /tokenize)")
            return replace(r, prompt_text=_text(r, vocab_size), prompt_token_ids=None)
        ids = r.prompt(True, vocab_size)
        assert isinstance(ids, list)
        return replace(r, prompt_token_ids=space.map(ids))
    stored = r.prompt_token_ids
    key = (
        r.request_id,
        r.prompt_len,
        _digest(repr(stored)) if stored is not None else "",
    )
    got = tokens.cal.chat.get(key)
    if got is None:
        got = await tokens.chat_text(r.prompt_len, _content_ids(r, vocab_size))
        if got is None:
            fallback.append("the server cannot build chat prompts (no /tokenize or /detokenize)")
            return replace(r, prompt_text=_text(r, vocab_size), prompt_token_ids=None)
        tokens.cal.chat[key] = got
    return replace(r, prompt_text=got[0], prompt_token_ids=None)


async def prepare_for_server(
    wl: Workload,
    tokens: ServerTokens,
    *,
    endpoint: Endpoint,
    vocab_size: int,
) -> Workload:
    """Every request's prompt as this server should get it (module docstring). Requests keep
    their requested ``prompt_len``, except given text, which takes the server's count."""
    fallback: list[str] = []
    todo = list(wl.requests)
    done: list[WorkloadRequest] = []
    if endpoint == "chat" and todo:
        # the template's tokens and a first tokens-per-id estimate, before going parallel
        await tokens.chat_overhead()
        done.append(await _prepare_one(todo[0], tokens, endpoint, vocab_size, fallback))
        todo = todo[1:]
    done += await asyncio.gather(
        *(_prepare_one(r, tokens, endpoint, vocab_size, fallback) for r in todo)
    )
    reqs = done
    if fallback:
        log.warning("prompt lengths are approximate: %s", fallback[0])
    return Workload(list(reqs), wl.source, wl.closed_loop_concurrency)
