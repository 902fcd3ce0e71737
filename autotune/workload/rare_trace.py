"""A synthetic trace with one rare long request: the case validation's resampling must keep
in every sample (docs/tuning.md#7-validation, "Fresh samples, fresh noise"). The resampling
tests and ``benchmarks/trace_resample.py`` measure on the same trace."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RareRequestTrace", "rare_request_trace"]


@dataclass(frozen=True)
class RareRequestTrace:
    """Per request: prompt and output tokens, arrival in seconds from the first request;
    ``rare`` is the long request's index, ``p99`` the trace's 99th percentile of prompt +
    output before that request was made long."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    arrival: tuple[float, ...]
    rare: int
    p99: float


def rare_request_trace(seed: int, n: int = 400, rate: float = 4.0) -> RareRequestTrace:
    """``n`` requests (log-normal lengths, Poisson arrivals at ``rate`` req/s), one of them
    5x longer (prompt + output) than the 99th percentile of the rest."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(np.log(1200), 0.7, n), 16, None).astype(int)
    out = np.clip(rng.lognormal(np.log(250), 0.6, n), 4, None).astype(int)
    p99 = float(np.percentile(prompt + out, 99))
    k = int(rng.integers(n // 4, 3 * n // 4))
    prompt[k], out[k] = int(5 * p99) - 200, 200
    t = np.cumsum(rng.exponential(1 / rate, n))
    return RareRequestTrace(
        prompt=tuple(int(p) for p in prompt),
        output=tuple(int(o) for o in out),
        arrival=tuple(float(x - t[0]) for x in t),
        rare=k,
        p99=p99,
    )
