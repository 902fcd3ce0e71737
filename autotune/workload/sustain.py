"""Make a load level long enough to mean something (pure; docs/tuning.md#13-level-length).

A study replays one workload sample at every load of its lattice, so the level's length is
the sample's span divided by the load scale: 400 requests at 4 req/s last 100 s at 1x and
6 s at 16x, short enough for a server that cannot sustain the rate to absorb the burst in its
queue and still meet a TTFT SLO. :func:`sustain` loops the sample until the level lasts at
least ``min_s`` engine seconds at its scale and holds at least ``min_n`` requests.

The loop repeats the sample's timeline end to end: copy ``k`` is the sample shifted by ``k``
times its last arrival, so copy ``k``'s first request follows copy ``k - 1``'s last by the
sample's own first gap (for a generated arrival process one draw of it, 1/rate on average)
and the offered rate, ``N / last arrival``, is exactly the sample's. Whole copies only: every
request of the sample weighs the same in the level, as it does in the sample.

Copies get fresh request ids, so prompts generated from the id are new content; given text is
dropped (a prompt of the same length is generated from the new id) and given token ids are
renamed within the sample's own ids (each id becomes the next one up in sorted order, ``k``
places on), which keeps the prompts' lengths and the prefixes they share inside one copy but
shares none with another copy: vLLM's prefix cache cannot serve a copy from its predecessor.

The stored key of a looped level (``sample_requests``) is owned here
(docs/architecture.md#4-one-owner-per-stored-key).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from autotune.errors import ConfigError
from autotune.workload.core import Workload, WorkloadRequest

__all__ = [
    "MAX_LEVEL_REQUESTS",
    "copies_needed",
    "looped_stored",
    "sample_requests",
    "sustain",
    "tiled",
]

_SAMPLE_REQUESTS = "sample_requests"  # a looped level's stored metrics: requests in the sample
# a looped level is held in memory: a sample whose span is a sliver of the minimum (a few
# requests at a huge rate) must not become a billion requests
MAX_LEVEL_REQUESTS = 1_000_000


def copies_needed(wl: Workload, scale: float, min_s: float, min_n: int) -> int:
    """How many copies of ``wl`` a level at ``scale`` needs (1: the sample as it is).

    Open loop: the last arrival divided by ``scale`` reaches ``min_s`` and the requests reach
    ``min_n``. A closed loop, or a sample sent all at once, has no span to stretch: only the
    request minimum applies.
    """
    n = len(wl)
    if n == 0:
        return 1
    k = max(1, math.ceil(min_n / n)) if min_n > 0 else 1
    times = wl.arrivals()
    span = float(times[-1]) if times is not None else 0.0
    if span > 0 and min_s > 0:
        k_s = max(1, math.ceil(min_s * scale / span))
        while k_s * span / scale < min_s:  # float rounding of the division
            k_s += 1
        k = max(k, k_s)
    return k


def sustain(wl: Workload, scale: float, min_s: float, min_n: int) -> Workload:
    """``wl`` looped into whole copies until a level at load ``scale`` lasts at least
    ``min_s`` engine seconds (its last arrival, once scaled) and holds at least ``min_n``
    requests; ``wl`` itself (the same object) when it already does. The result is on the
    sample's own timeline: the runner scales it as it scales the sample."""
    if scale <= 0:
        raise ValueError(f"load scale must be > 0, got {scale}")
    k = copies_needed(wl, scale, min_s, min_n)
    if k == 1:
        return wl
    if k * len(wl) > MAX_LEVEL_REQUESTS:
        raise ConfigError(
            f"strategy.min_level_s {min_s:g} s at load x{scale:g}: the {len(wl)}-request "
            f"sample would be looped into {k * len(wl):,} requests, over {MAX_LEVEL_REQUESTS:,}; "
            "lower strategy.min_level_s or make the sample longer (workload.num_prompts)"
        )
    return _repeated(wl, k, "@", f"{wl.source}; looped x{k} ({len(wl)} requests per copy)")


def tiled(wl: Workload, k: int) -> Workload:
    """``k`` copies of ``wl`` (itself a looped level or not) one after the other, request ids
    marked ``#d<copy>``: the load of ``k`` devices at one device's rate and span
    (docs/tuning.md#16-the-parallelism-stage)."""
    if k <= 1:
        return wl
    return _repeated(wl, k, "#d", f"{wl.source}; x{k} devices")


def _repeated(wl: Workload, k: int, mark: str, source: str) -> Workload:
    """``k`` copies of ``wl``, each shifted by its span, ids marked ``<mark><copy>``."""
    times = wl.arrivals()
    period = float(times[-1]) if times is not None else 0.0
    renames = _token_renames(wl.requests)
    reqs = list(wl.requests)
    for c in range(1, k):
        reqs += [_copy(r, c, c * period, renames, mark) for r in wl.requests]
    return Workload(reqs, source, wl.closed_loop_concurrency, wl.dropped)


def _copy(
    r: WorkloadRequest,
    c: int,
    shift: float,
    renames: tuple[np.ndarray, int] | None,
    mark: str,
) -> WorkloadRequest:
    ids: tuple[int, ...] | None = None
    if r.prompt_token_ids is not None and renames is not None:
        ids = _renamed(r.prompt_token_ids, c, renames)
    return replace(
        r,
        request_id=f"{r.request_id}{mark}{c}",
        arrival=None if r.arrival is None else r.arrival + shift,
        prompt_text=None,
        prompt_token_ids=ids,
    )


def _token_renames(reqs: list[WorkloadRequest]) -> tuple[np.ndarray, int] | None:
    """The sorted distinct token ids the sample's prompts use, and their count (None when
    no prompt carries ids)."""
    given = [r.prompt_token_ids for r in reqs if r.prompt_token_ids is not None]
    if not given:
        return None
    vocab = np.unique(np.concatenate([np.asarray(t, dtype=np.int64) for t in given]))
    return vocab, int(vocab.size)


def _renamed(
    ids: tuple[int, ...], c: int, renames: tuple[np.ndarray, int]
) -> tuple[int, ...] | None:
    """``ids`` with each id moved ``c`` places on among the sample's sorted ids; None (a
    generated prompt of the same length) when that would give the same ids back."""
    vocab, m = renames
    if c % m == 0:
        return None
    pos = np.searchsorted(vocab, np.asarray(ids, dtype=np.int64))
    return tuple(int(x) for x in vocab[(pos + c) % m])


def looped_stored(sample_n: int) -> dict[str, Any]:
    """What the stored metrics of a level that looped a sample of ``sample_n`` requests add
    (the level's own counts say how many it replayed)."""
    return {_SAMPLE_REQUESTS: sample_n}


def sample_requests(metrics: Mapping[str, Any]) -> int | None:
    """The requests of the sample a stored level looped (None: it replayed the sample)."""
    v = metrics.get(_SAMPLE_REQUESTS)
    return None if v is None else int(v)
