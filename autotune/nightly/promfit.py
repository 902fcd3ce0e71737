"""Refresh from Prometheus (docs/nightly.md#22-from-prometheus).

Over the traffic window, vLLM's ``vllm:request_prompt_tokens`` and
``vllm:request_generation_tokens`` histograms give each request's lengths in buckets, and
their ``_count`` the request rate. The buckets follow vLLM's 1-2-5 ladder (1, 2, 5, 10, 20,
...), far too coarse to read percentiles off, so a lognormal is fitted: at each bucket bound
``b`` with cumulative share ``F(b)`` strictly between 0 and 1, ``Phi^-1(F(b)) = (ln b - mu) /
sigma`` is a straight line in ``ln b``, fitted by least squares weighted by each point's
binomial precision. Its tail is approximate, and the profile says so.

Requests refused as over-length never reach those histograms: vLLM counts them only in
``http_requests_total{status="4xx"}`` of its completions and chat handlers; the refresh
counts those and warns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.errors import ServiceError
from autotune.nightly.drift import traffic_profile

if TYPE_CHECKING:
    from autotune.nightly.job_config import NightlyConfig
    from autotune.nightly.refresh import Refresh

__all__ = ["LogNormalFit", "fit_lognormal", "refresh_from_prometheus", "rejected_warning"]

_N = NormalDist()
_HANDLERS = 'handler=~".*/(chat/)?completions"'


@dataclass(frozen=True)
class LogNormalFit:
    mu: float
    sigma: float
    count: float

    def quantile(self, q: float) -> float:
        return math.exp(self.mu + self.sigma * _N.inv_cdf(q))

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)


def fit_lognormal(buckets: Mapping[float, float], mean: float | None = None) -> LogNormalFit:
    """Fit a lognormal to cumulative histogram buckets (upper bound -> count at or below;
    ``+Inf`` included). Observations within one bucket (a constant length) have no spread
    to fit: with their ``mean`` (the histogram's ``_sum / _count``) they are a point."""
    total = buckets.get(math.inf)
    if total is None or not total > 0:
        raise ValueError("the histogram holds no observations (no +Inf bucket count)")
    xs, zs, ws = [], [], []
    for bound, cum in sorted(buckets.items()):
        if not math.isfinite(bound) or bound <= 0:
            continue
        f = min(max(cum / total, 0.0), 1.0)
        if 0.0 < f < 1.0:
            z = _N.inv_cdf(f)
            # Var(z) ~ F(1-F) / (n phi(z)^2): weight by its inverse
            ws.append(total * _N.pdf(z) ** 2 / (f * (1.0 - f)))
            xs.append(math.log(bound))
            zs.append(z)
    if len(xs) < 2:
        if mean is not None and mean > 0:
            return LogNormalFit(math.log(mean), 0.0, float(total))
        raise ValueError("the observations span fewer than two bucket bounds: no fit")
    xa, za, wa = np.asarray(xs), np.asarray(zs), np.asarray(ws)
    xm, zm = float(np.average(xa, weights=wa)), float(np.average(za, weights=wa))
    slope = float(np.sum(wa * (xa - xm) * (za - zm)) / np.sum(wa * (xa - xm) ** 2))
    if not slope > 0:
        raise ValueError("the histogram does not grow with length: no lognormal fit")
    sigma = 1.0 / slope
    mu = float(xm - zm * sigma)
    return LogNormalFit(mu, sigma, float(total))


def rejected_warning(rejected: float, accepted: float) -> str | None:
    """The warning for ``rejected`` 4xx answers of the completions handlers (None: none)."""
    if not rejected >= 0.5:
        return None
    share = rejected / (rejected + accepted) if rejected + accepted > 0 else 1.0
    return (
        f"{rejected:.0f} requests ({100 * share:.1f} %) got a 4xx answer from the completions "
        "and chat handlers in the window: requests refused as over-length never reach the "
        "length histograms, so today's lengths may be underestimated"
    )


def _buckets(rows: Sequence[Mapping[str, Any]]) -> dict[float, float]:
    out: dict[float, float] = {}
    for row in rows:
        le = str(row["metric"].get("le", ""))
        bound = math.inf if le == "+Inf" else float(le)
        out[bound] = out.get(bound, 0.0) + float(row["value"][1])
    return out


def refresh_from_prometheus(cfg: NightlyConfig, *, at: float | None = None) -> Refresh:
    from autotune.nightly.refresh import Refresh
    from autotune.telemetry.prometheus import PrometheusTelemetry

    t = cfg.traffic
    assert t.prometheus_url is not None
    prom = PrometheusTelemetry(t.prometheus_url)
    now = time.time() if at is None else at
    window = f"{max(1, round(t.window_h * 3600))}s"
    sel = "{" + t.selector + "}" if t.selector else ""

    def hist(family: str) -> LogNormalFit:
        rows = prom.query(f"sum by (le) (increase({family}_bucket{sel}[{window}]))", now)
        inc = f"{sel}[{window}]))"
        sums = prom.query(f"sum(increase({family}_sum{inc} / sum(increase({family}_count{inc}", now)
        mean = float(sums[0]["value"][1]) if sums else None
        try:
            return fit_lognormal(
                _buckets(rows), mean if mean is not None and math.isfinite(mean) else None
            )
        except ValueError as exc:
            raise ServiceError(
                f"Prometheus at {prom.url}: {family} over the last {window}: {exc}"
            ) from None

    prompt, output = hist("vllm:request_prompt_tokens"), hist("vllm:request_generation_tokens")
    rate = prompt.count / (t.window_h * 3600)
    inner = f"{t.selector}," if t.selector else ""
    rej_rows = prom.query(
        f'sum(increase(http_requests_total{{{inner}status="4xx",{_HANDLERS}}}[{window}]))', now
    )
    rejected = float(rej_rows[0]["value"][1]) if rej_rows else 0.0
    warnings = [w for w in [rejected_warning(rejected, prompt.count)] if w]
    section = {
        "source": "synthetic",
        "num_prompts": t.num_prompts,
        "input_len": max(1, round(prompt.mean)),
        "input_sigma": round(prompt.sigma, 4),
        "output_len": max(1, round(output.mean)),
        "output_sigma": round(output.sigma, 4),
        "arrival": "poisson",
        "rate": rate if rate > 0 else 1.0,
        "seed": t.seed,
    }
    rng = np.random.default_rng(t.seed)
    n = 20000
    p = np.maximum(1, np.round(rng.lognormal(prompt.mu, prompt.sigma, n)))
    o = np.maximum(1, np.round(rng.lognormal(output.mu, output.sigma, n)))
    source = f"Prometheus {prom.url} over {window} ({prompt.count:.0f} requests; lognormal fit)"
    profile = traffic_profile(p, o, rate, source=source, approximate_tail=True)
    return Refresh(section, profile, source, warnings)
