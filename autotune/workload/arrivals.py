"""Arrival processes: pure functions returning send times (seconds from the start).

They follow ``vllm bench serve`` (``serve.py::get_request``,
docs/loadgen.md#21-arrivals-as-vllm-bench-serve-makes-them) so a schedule here and one from
vLLM offer the same load:

- gaps are gamma(shape=b, scale=1/(rate*b)): mean 1/rate, CV 1/sqrt(b); b = 1 is Poisson,
  b = inf is constant;
- the first request is sent after the first gap, not at 0;
- without a ramp the cumulative schedule is rescaled so the last arrival is exactly at
  N/rate (vLLM's "normalize_factor": offered rate over the run equals the nominal rate,
  whatever the seed; gaps keep their gamma shape);
- draws come from numpy's legacy ``RandomState(seed)``, the generator vLLM seeds with
  ``np.random.seed(seed)``, so a vLLM run that draws nothing else from it first gets the
  same gaps **[not checked end to end against vLLM]**.

Closed loop has no times at all: :meth:`Workload.closed_loop` marks it for the runner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import numpy.typing as npt

from autotune.errors import ConfigError

__all__ = ["all_at_once", "constant", "gamma", "poisson", "ramp", "scale_trace"]

FloatArray = npt.NDArray[np.float64]


def _check_n(n: int) -> None:
    if n < 0:
        raise ConfigError(f"arrivals: number of requests must be >= 0, got {n}")


def _check_rate(name: str, rate: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"arrivals: {name} must be a finite number > 0 req/s, got {rate}")


def _rng(seed: int) -> np.random.RandomState:
    if not 0 <= seed < 2**32:
        raise ConfigError(f"arrivals: seed must be in [0, 2**32), got {seed}")
    return np.random.RandomState(seed)


def _gaps(rates: FloatArray, burstiness: float, seed: int) -> FloatArray:
    if not burstiness > 0:
        raise ConfigError(f"arrivals: burstiness must be > 0, got {burstiness}")
    if math.isinf(burstiness):
        return 1.0 / rates
    return _rng(seed).gamma(shape=burstiness, scale=1.0 / (rates * burstiness))


def all_at_once(n: int) -> FloatArray:
    """Every request at t = 0: vLLM's default ``--request-rate inf``."""
    _check_n(n)
    return np.zeros(n)


def gamma(
    n: int, rate: float, burstiness: float = 1.0, seed: int = 0, *, rescale: bool = True
) -> FloatArray:
    """Gamma-gap arrivals at ``rate`` req/s (vLLM ``--request-rate`` and ``--burstiness``).

    ``burstiness`` < 1 is burstier than Poisson, > 1 smoother, ``math.inf`` constant.
    ``rescale`` (vLLM's behaviour, on by default) puts the last arrival at ``n / rate``.
    """
    _check_n(n)
    _check_rate("rate", rate)
    times = np.cumsum(_gaps(np.full(n, float(rate)), burstiness, seed))
    if rescale and n and times[-1] > 0:
        times *= (n / rate) / times[-1]
        times[-1] = n / rate  # exact, not off by the last float rounding
    return times


def poisson(n: int, rate: float, seed: int = 0, *, rescale: bool = True) -> FloatArray:
    """Poisson arrivals (exponential gaps): :func:`gamma` with burstiness 1."""
    return gamma(n, rate, 1.0, seed, rescale=rescale)


def constant(n: int, rate: float) -> FloatArray:
    """Evenly spaced arrivals ``1/rate, 2/rate, ..., n/rate`` (vLLM with burstiness inf)."""
    _check_n(n)
    _check_rate("rate", rate)
    return np.arange(1, n + 1, dtype=np.float64) / rate


def ramp(
    n: int,
    start_rate: float,
    end_rate: float,
    *,
    burstiness: float = 1.0,
    seed: int = 0,
    strategy: Literal["linear", "exponential"] = "linear",
) -> FloatArray:
    """A rate ramp (vLLM ``--ramp-up-strategy``): request ``i`` is drawn at the rate
    ``start + (end - start) * i/(n-1)`` (linear) or ``start * (end/start) ** (i/(n-1))``
    (exponential). Not rescaled, as in vLLM. Default burstiness 1 is vLLM's; pass
    ``math.inf`` for deterministic gaps. Unlike vLLM, a start rate of 0 is refused: its
    first gap would be infinite.
    """
    _check_n(n)
    _check_rate("start_rate", start_rate)
    _check_rate("end_rate", end_rate)
    progress = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    if strategy == "linear":
        rates = start_rate + (end_rate - start_rate) * progress
    elif strategy == "exponential":
        rates = start_rate * (end_rate / start_rate) ** progress
    else:
        raise ConfigError(
            f"arrivals: unknown ramp strategy {strategy!r} (expected 'linear' or 'exponential')"
        )
    return np.cumsum(_gaps(rates, burstiness, seed))


def scale_trace(
    times: Iterable[float], *, time_scale: float = 1.0, rate_scale: float = 1.0
) -> FloatArray:
    """Trace timestamps (s) made relative to the first and stretched.

    ``time_scale`` multiplies gaps (GuideLLM's replay ``time_scale``: 2.0 doubles them);
    ``rate_scale`` k replays the trace at k times its rate (gaps divided by k). Timestamps
    must be non-negative and sorted; the loaders check this per line, with the file named.
    """
    _check_rate("time_scale", time_scale)
    _check_rate("rate_scale", rate_scale)
    t = np.asarray(list(times), dtype=np.float64)
    if t.size == 0:
        return t
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ConfigError("arrivals: trace timestamps must be finite and >= 0")
    if np.any(np.diff(t) < 0):
        raise ConfigError("arrivals: trace timestamps must be sorted (non-decreasing)")
    scaled: FloatArray = (t - t[0]) * (time_scale / rate_scale)
    return scaled
