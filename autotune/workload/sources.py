"""Request sources without timestamps: ShareGPT, vLLM's ``random``, synthetic lengths.

Each returns a :class:`Workload` with every arrival at 0 (vLLM's ``--request-rate inf``);
give it a schedule with :meth:`Workload.with_arrivals` and :mod:`.arrivals`, or make it a
closed loop with :meth:`Workload.closed_loop`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from autotune.errors import ConfigError
from autotune.workload._io import bad, iter_json_array
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.text import (
    DEFAULT_VOCAB_SIZE,
    MIN_TOKEN_ID,
    TokenCounter,
    approx_token_count,
)

__all__ = [
    "Empirical",
    "Fixed",
    "LengthDist",
    "LogNormal",
    "Uniform",
    "is_valid_sequence",
    "load_sharegpt",
    "random_workload",
    "sharegpt_like_workload",
    "synthetic_workload",
]

IntArray = npt.NDArray[np.int64]


def is_valid_sequence(prompt_len: int, output_len: int, *, fixed_output: bool = False) -> bool:
    """vLLM's ShareGPT filter (``datasets/utils.py``): prompt and output >= 4 tokens (output
    unchecked when fixed), prompt <= 1024, prompt + output <= 2048."""
    return not (
        prompt_len < 4
        or (not fixed_output and output_len < 4)
        or prompt_len > 1024
        or prompt_len + output_len > 2048
    )


def _check_count(num_requests: int) -> None:
    if num_requests < 1:
        raise ConfigError(f"num_requests must be >= 1, got {num_requests}")


def load_sharegpt(
    path: str | Path,
    num_requests: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    oversample: bool = True,
    output_len: int | None = None,
    count_tokens: TokenCounter | None = None,
    request_id_prefix: str = "sharegpt-",
) -> Workload:
    """ShareGPT JSON sampled as ``vllm bench serve --dataset-name sharegpt`` samples it.

    Entries with fewer than two turns are dropped, the rest shuffled with
    ``random.seed(seed)``; prompt = turn 0, reference completion = turn 1 (roles are not
    checked); the first ``num_requests`` that pass :func:`is_valid_sequence` are taken, and
    when fewer pass, survivors are drawn again at random (seeded) up to ``num_requests``.
    ``output_len`` fixes every output length (vLLM's ``--sharegpt-output-len``).

    Lengths come from ``count_tokens`` (e.g. :func:`.text.hf_token_counter`), by default
    the approximate word rule: without the model's tokenizer, which entries pass the
    filter may differ a little from vLLM's choice.
    """
    _check_count(num_requests)
    if output_len is not None and output_len < 1:
        raise ConfigError(f"output_len must be >= 1, got {output_len}")
    path = Path(path)
    count = count_tokens or approx_token_count
    entries: list[tuple[int, str, str]] = []
    for line, entry in iter_json_array(path):
        if not isinstance(entry, dict):
            raise bad(path, line, None, f"expected a JSON object, got {type(entry).__name__}")
        conv = entry.get("conversations")
        if conv is None:
            continue
        if not isinstance(conv, list):
            raise bad(path, line, "conversations", "expected a list of turns")
        if len(conv) < 2:
            continue
        texts = []
        for turn in (0, 1):
            value = conv[turn].get("value") if isinstance(conv[turn], dict) else None
            if not isinstance(value, str):
                raise bad(path, line, f"conversations[{turn}].value", "expected a string")
            texts.append(value)
        entries.append((line, texts[0], texts[1]))
    rng = random.Random(seed)  # same sequence as vLLM's random.seed(seed); random.shuffle
    if shuffle:
        rng.shuffle(entries)

    chosen: list[tuple[str, int, int]] = []
    for _, prompt, completion in entries:
        if len(chosen) >= num_requests:
            break
        p = count(prompt)
        o = output_len if output_len is not None else count(completion)
        if is_valid_sequence(p, o, fixed_output=output_len is not None):
            chosen.append((prompt, p, o))
    if not chosen:
        raise bad(
            path,
            None,
            None,
            f"none of {len(entries)} conversations with two turns "
            "passes vLLM's length filter (prompt 4..1024, total <= 2048 tokens)",
        )
    picked = len(chosen)
    if oversample and picked < num_requests:
        redraw = random.Random(seed)  # vLLM re-seeds before oversampling
        chosen += [redraw.choice(chosen[:picked]) for _ in range(num_requests - picked)]
    requests = [
        WorkloadRequest(p, o, prompt_text=text, request_id=f"{request_id_prefix}{i}")
        for i, (text, p, o) in enumerate(chosen)
    ]
    extra = f", {len(chosen) - picked} oversampled" if len(chosen) > picked else ""
    return Workload(requests, f"sharegpt {path} (seed {seed}, {picked} sampled{extra})")


def random_workload(
    num_requests: int = 1000,
    *,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    num_special_tokens: int = 0,
    request_id_prefix: str = "random-",
) -> Workload:
    """``vllm bench serve --dataset-name random`` (``--random-input-len``, ``-output-len``,
    ``-range-ratio``, ``-prefix-len``; the defaults are vLLM's).

    Lengths are uniform over ``[floor(L(1-r)), ceil(L(1+r))]`` (output at least 1), drawn
    from ``default_rng(seed)`` in vLLM's order; each prompt is the shared random prefix then
    ``allowed[(offset + i + arange(len)) % len(allowed)]``. ``num_special_tokens`` is the
    tokenizer's ``num_special_tokens_to_add()`` (e.g. 1 for Llama's BOS), subtracted from
    ``input_len`` as vLLM does. vLLM's decode/re-encode pass needs a tokenizer and is not
    reproduced: prompts are sent as these token ids, or as their word text.
    """
    _check_count(num_requests)
    if not 0.0 <= range_ratio < 1.0:
        raise ConfigError("random: range_ratio must be in [0, 1).")
    if input_len < 0 or output_len < 1 or prefix_len < 0 or num_special_tokens < 0:
        raise ConfigError("random: input_len, prefix_len must be >= 0 and output_len >= 1")
    real_input = max(0, input_len - num_special_tokens)
    in_lo = math.floor(real_input * (1 - range_ratio))
    in_hi = math.ceil(real_input * (1 + range_ratio))
    out_lo = max(math.floor(output_len * (1 - range_ratio)), 1)
    out_hi = max(math.ceil(output_len * (1 + range_ratio)), 1)
    if prefix_len + in_lo < 1:
        raise ConfigError(
            f"random: input_len {input_len} is too small: the shortest prompt "
            f"(prefix {prefix_len} + {in_lo} sampled) would be empty"
        )
    if vocab_size <= MIN_TOKEN_ID:
        raise ConfigError(f"random: vocab_size must be > {MIN_TOKEN_ID}, got {vocab_size}")
    rng = np.random.default_rng(seed)
    in_lens = rng.integers(in_lo, in_hi + 1, size=num_requests)
    out_lens = rng.integers(out_lo, out_hi + 1, size=num_requests)
    offsets = rng.integers(0, vocab_size, size=num_requests)
    allowed = np.arange(MIN_TOKEN_ID, vocab_size, dtype=np.int64)
    prefix = allowed[rng.integers(0, allowed.size, size=prefix_len)] if prefix_len else allowed[:0]
    requests = []
    for i in range(num_requests):
        inner = allowed[(offsets[i] + i + np.arange(in_lens[i])) % allowed.size]
        ids = tuple(np.concatenate([prefix, inner]).tolist())
        requests.append(
            WorkloadRequest(
                len(ids),
                int(out_lens[i]),
                prompt_token_ids=ids,
                request_id=f"{request_id_prefix}{i}",
            )
        )
    return Workload(
        requests,
        f"random (input {input_len}, output {output_len}, range ratio "
        f"{range_ratio}, prefix {prefix_len}, seed {seed})",
    )


class LengthDist(Protocol):
    """A distribution of token lengths; samples are clipped to >= 1 by the caller."""

    def sample(self, rng: np.random.Generator, n: int) -> IntArray: ...


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform over ``[low, high]`` inclusive."""

    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        if self.low > self.high:
            raise ConfigError(f"Uniform: low {self.low} > high {self.high}")
        return rng.integers(self.low, self.high + 1, size=n).astype(np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Lognormal of the given mean (``mu = ln(mean) - sigma^2/2``), rounded and clipped to
    ``[low, high]`` (``high`` None: unbounded)."""

    mean: float
    sigma: float
    low: int = 1
    high: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        if not (self.mean > 0 and self.sigma >= 0):
            raise ConfigError(f"LogNormal: mean must be > 0 and sigma >= 0, got {self}")
        mu = math.log(self.mean) - self.sigma**2 / 2
        x = np.rint(rng.lognormal(mu, self.sigma, size=n))
        return np.clip(x, self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    """Draws with replacement from observed lengths (e.g. a profile of production traffic)."""

    values: tuple[int, ...]

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        if not self.values:
            raise ConfigError("Empirical: no values to sample from")
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)


def synthetic_workload(
    num_requests: int,
    prompt: LengthDist,
    output: LengthDist,
    *,
    seed: int = 0,
    request_id_prefix: str = "synthetic-",
) -> Workload:
    """Independent prompt and output lengths from two distributions (seeded). Prompts are
    generated per request when sent (unique content: no accidental prefix sharing)."""
    _check_count(num_requests)
    rng = np.random.default_rng(seed)
    p = np.maximum(prompt.sample(rng, num_requests), 1)
    o = np.maximum(output.sample(rng, num_requests), 1)
    requests = [
        WorkloadRequest(int(a), int(b), request_id=f"{request_id_prefix}{i}")
        for i, (a, b) in enumerate(zip(p, o, strict=True))
    ]
    return Workload(requests, f"synthetic (prompt {prompt}, output {output}, seed {seed})")


# Built-in ShareGPT-like lengths: lognormal prompt (median ~148 tokens) and reference output
# (median ~128) cut by vLLM's filter, giving means of about 215 and 200 tokens. For scale,
# vLLM PR #18566 reports 1000 ShareGPT prompts on Llama-3.1-8B-Instruct as 229,711 input
# tokens (chat template included) and 203,068 generated tokens. The real file cannot be
# downloaded here; shape and tails are an approximation, not a fit.
SHAREGPT_LIKE_PROMPT = LogNormal(mean=345.0, sigma=1.3)
SHAREGPT_LIKE_OUTPUT = LogNormal(mean=211.0, sigma=1.0)


def sharegpt_like_workload(
    num_requests: int = 1000, *, seed: int = 0, request_id_prefix: str = "sharegpt-like-"
) -> Workload:
    """Lengths shaped like filtered ShareGPT, without the file (see the note above)."""
    _check_count(num_requests)
    rng = np.random.default_rng(seed)
    kept: list[tuple[int, int]] = []
    while len(kept) < num_requests:  # ~95 % pass the filter: one or two rounds
        batch = max(64, 2 * (num_requests - len(kept)))
        ps, os_ = SHAREGPT_LIKE_PROMPT.sample(rng, batch), SHAREGPT_LIKE_OUTPUT.sample(rng, batch)
        kept += [
            (int(a), int(b))
            for a, b in zip(ps, os_, strict=True)
            if is_valid_sequence(int(a), int(b))
        ]
    requests = [
        WorkloadRequest(a, b, request_id=f"{request_id_prefix}{i}")
        for i, (a, b) in enumerate(kept[:num_requests])
    ]
    return Workload(requests, f"sharegpt-like lengths (seed {seed})")
