"""Seeded synthetic request lengths (the workload package brings real datasets and traces)."""

from __future__ import annotations

import math

import numpy as np

from autotune.sim.request import SimRequest

__all__ = ["lognormal_requests"]


def lognormal_requests(
    n: int,
    mean_prompt: float,
    mean_output: float,
    *,
    seed: int = 0,
    rate: float | None = None,
    sigma_prompt: float = 0.5,
    sigma_output: float = 0.5,
    max_prompt: int | None = None,
    max_output: int | None = None,
) -> list[SimRequest]:
    """``n`` requests with lognormal prompt/output lengths of the given means.

    ``mu = ln(mean) - sigma^2/2`` keeps the mean at ``mean``. Arrivals are all at 0 when
    ``rate`` is None, else a Poisson process of ``rate`` requests/s. Lengths are clipped to
    ``[1, max_*]`` (default: 8x the mean), so a seed always gives the same requests.
    """
    if n < 0 or mean_prompt < 1 or mean_output < 1:
        raise ValueError("n >= 0 and means >= 1 required")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be positive")
    rng = np.random.default_rng(seed)

    def draw(mean: float, sigma: float, cap: int | None) -> np.ndarray:
        mu = math.log(mean) - sigma * sigma / 2
        x = np.rint(rng.lognormal(mu, sigma, n))
        return np.clip(x, 1, cap or int(8 * mean)).astype(np.int64)

    prompts = draw(mean_prompt, sigma_prompt, max_prompt)
    outputs = draw(mean_output, sigma_output, max_output)
    arrivals = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1.0 / rate, n))
    return [
        SimRequest(int(p), int(o), float(a), request_id=f"req-{i}")
        for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals, strict=True))
    ]
