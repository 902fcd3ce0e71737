"""The validation verdict and its reason (pure; docs/tuning.md#7-validation).

Every config, the baseline included, is held to one bar: its latency and error SLOs held in
every run, where its run in the study counts as one of its runs, and the share of requests
``max_model_len`` cut, pooled over its validation repeats, is within the limit. A baseline
that broke its SLOs in the study therefore cannot be kept on the strength of re-measurements
alone (a resample that happens to lack the trace's rare long request lets it pass).

- ``recommend``: the baseline held in every run and the candidate with the best lower bound
  among those that held in every run beats it beyond noise (lower bound above 0);
- ``keep``: the baseline held in every run and no candidate that did beats it; the reason
  names, per candidate, why not (no gain beyond noise, the runs it failed, the over-length
  limit);
- ``no-baseline``: the baseline broke the SLOs (a run or the pooled over-length limit) and a
  candidate held in every run: that candidate is recommended, whatever its gain, as the
  nightly job replaces an infeasible incumbent (docs/nightly.md#5-promote-or-keep);
- ``too-noisy``: the baseline held in every run and the server's noise (measured once per
  study, :mod:`autotune.tuning.measure.noise`) cannot tell the candidates from it: no
  candidate that held every run beats it beyond noise and beyond the noise band, and not
  every candidate is worse than it beyond the band (or broke its SLOs). Nothing is
  recommended and the baseline is not "kept" either; the reason gives the gains, the band
  and the runs. Without a noise record (a study from before it was measured) there is no
  band, and ``recommend`` and ``keep`` are decided as above;
- ``undecided``: no config held in every run. Nothing is recommended: the runs cannot tell a
  config that breaks the latency or error SLOs from noise, and more repeats can; a
  ``max_model_len`` that cuts too many requests of the fresh samples, the baseline's
  included, needs a larger one (or a larger limit), not more repeats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from autotune.store.records import TrialRecord
from autotune.tuning.measure.noise import NoiseRecord

__all__ = ["Contender", "Held", "Verdict", "held_in_study", "held_text", "verdict_of"]

Verdict = Literal["recommend", "keep", "no-baseline", "too-noisy", "undecided"]


@dataclass(frozen=True)
class Held:
    """How a config fared against its SLOs over its runs."""

    runs: int  # validation runs finished
    held: int  # of which its latency and error SLOs held
    study: bool | None  # its run in the study held them (None: not known)
    overlength_rate: float | None  # pooled over its validation runs
    overlength_ok: bool

    @property
    def all_runs(self) -> int:
        """Its runs, the study's included when known."""
        return self.runs + (self.study is not None)

    @property
    def all_held(self) -> int:
        return self.held + (self.study is True)

    @property
    def every(self) -> bool:
        """It held its SLOs in every run, the study's included, and the over-length limit."""
        return self.runs > 0 and self.all_held == self.all_runs and self.overlength_ok


@dataclass(frozen=True)
class Contender:
    """A candidate as the verdict sees it."""

    trial: int
    held: Held
    low: float | None  # the lower bound of its paired gain interval (None: no pairs)
    mean_figure: float | None  # its mean figure over the runs that held
    gain: float | None = None  # its mean paired gain, percent (None: no pairs)
    high: float | None = None  # the upper bound of that interval
    pairs: int = 0  # the paired runs behind it

    def beyond(self, band: float) -> bool:
        """It beats the baseline beyond noise and beyond the noise band ``band``."""
        return self.low is not None and self.low > 0 and self.gain is not None and self.gain > band

    def worse(self, band: float) -> bool:
        """It is worse than the baseline beyond the noise band ``band``."""
        return self.gain is not None and self.gain < -band


def held_text(h: Held) -> str:
    """E.g. "in 5 of 6 runs (its run in the study failed)"."""
    text = f"in {h.all_held} of {h.all_runs} run{'s' if h.all_runs != 1 else ''}"
    if h.study is False:
        text += " (its run in the study failed)"
    return text


def _overlength(h: Held, limit: float) -> str:
    rate = 100 * (h.overlength_rate or 0.0)
    return (
        f"cut {rate:.2f} % of requests over its repeats (max_model_len; the limit is "
        f"{100 * limit:g} %)"
    )


def _why_not(c: Contender, limit: float) -> str:
    """Why a candidate is not recommended over a baseline that held every run."""
    if c.held.all_held < c.held.all_runs:
        return f"trial {c.trial} held the SLOs only {held_text(c.held)}"
    if not c.held.overlength_ok:
        return f"trial {c.trial} {_overlength(c.held, limit)}{_forgone(c)}"
    return f"trial {c.trial} does not beat it beyond noise"


def _forgone(c: Contender) -> str:
    """What a candidate refused only for the over-length limit would have gained, when its
    paired interval lies above 0: the lengths drawn decide that limit, not the server, so
    the same concurrency at a longer max_model_len may keep the gain (it has to be measured;
    docs/tuning.md#11-measured-tuning-quality, "Over-length on fresh samples")."""
    if c.low is None or c.low <= 0 or c.gain is None or c.high is None:
        return ""
    return (
        f", forgoing a paired gain of {c.gain:+.1f} % (interval {c.low:+.1f} … {c.high:+.1f} %); "
        "its concurrency at a larger max_model_len (search.max_model_len) may keep it"
    )


def _why_keep(ranked: Sequence[Contender], limit: float) -> str:
    noise = [c for c in ranked if c.held.every]
    others = [_why_not(c, limit) for c in ranked if not c.held.every]
    if not others:
        return "no candidate beats it beyond noise"
    if noise:
        others.append(
            "no other candidate beats it beyond noise"
            if len(noise) > 1
            else _why_not(noise[0], limit)
        )
    return "; ".join(others)


def _broke(h: Held, limit: float) -> str:
    """How a config that did not hold every run broke the SLOs."""
    parts = []
    if h.all_held < h.all_runs:
        parts.append(f"held them only {held_text(h)}")
    if not h.overlength_ok:
        parts.append(_overlength(h, limit))
    return " and ".join(parts)


Decided = tuple[Verdict | None, int | None, int | None, str | None]


def _gain_text(c: Contender) -> str:
    if c.gain is None:
        return f"trial {c.trial}: no paired run"
    iv = (
        f"interval {c.low:+.1f} … {c.high:+.1f} %, "
        if c.low is not None and c.high is not None and math.isfinite(c.low)
        else ""
    )
    runs = f"{c.pairs} paired run{'s' if c.pairs != 1 else ''}"
    return f"trial {c.trial} {c.gain:+.1f} % ({iv}{runs})"


def _with_band(
    ranked: Sequence[Contender],
    eligible: Sequence[Contender],
    best: int | None,
    noise: NoiseRecord,
    limit: float,
) -> Decided:
    """The baseline held every run and the server's noise band is known: recommend a
    candidate beyond noise and the band, keep when every candidate is worse beyond the band
    or broke its SLOs, else too noisy to tell (docs/tuning.md#7-validation)."""
    band = noise.band_pct
    top = next((c for c in eligible if c.beyond(band)), None)
    if top is not None:
        why = (
            f"trial {top.trial} held the SLOs {held_text(top.held)} and beats it beyond noise: "
            f"{_gain_text(top)}, beyond the noise band; {noise.text()}"
        )
        return "recommend", top.trial, top.trial, why
    unclear = [c for c in eligible if not c.worse(band)]
    if not unclear:
        why = _why_keep(ranked, limit)
        if eligible:
            why += f"; every candidate that held them is worse beyond noise ({noise.text()})"
        return "keep", None, best, why
    gains = "; ".join(_gain_text(c) for c in unclear)
    why = (
        "too noisy to tell on this server: no candidate gains beyond noise (interval above 0) "
        f"and beyond the noise band, nor loses beyond the band: {gains}; {noise.text()}"
    )
    return "too-noisy", None, best, why


def verdict_of(
    base: Held,
    ranked: Sequence[Contender],
    *,
    complete: bool,
    max_overlength_rate: float,
    noise: NoiseRecord | None = None,
) -> Decided:
    """(verdict, the recommended trial, the candidate whose interval is reported, the
    reason) from the baseline and the candidates ranked best first (by lower bound, then
    mean gain, then mean figure), and the server's noise when it was measured. No verdict
    while runs are missing."""
    limit = max_overlength_rate
    eligible = [c for c in ranked if c.held.every]
    best = (eligible or list(ranked))[0].trial if ranked else None
    if not complete or not ranked:
        return None, None, best, None
    if base.every and noise is not None:
        return _with_band(ranked, eligible, best, noise, limit)
    if base.every:
        top = eligible[0] if eligible else None
        if top is not None and top.low is not None and top.low > 0:
            why = f"trial {top.trial} held the SLOs {held_text(top.held)} and beats it beyond noise"
            return "recommend", top.trial, top.trial, why
        return "keep", None, best, _why_keep(ranked, limit)
    if eligible:
        top = eligible[0]
        if top.low is None:  # no repeat where both held: no gain to rank by
            top = max(eligible, key=lambda c: c.mean_figure or 0.0)
        why = (
            f"the current config breaks the SLOs: it {_broke(base, limit)}; trial {top.trial} "
            f"held them {held_text(top.held)}"
        )
        return "no-baseline", top.trial, top.trial, why
    configs = [base, *(c.held for c in ranked)]
    fails = [f"the baseline {_broke(base, limit)}"]
    fails += [f"trial {c.trial} {_broke(c.held, limit)}" for c in ranked]
    advice = []
    if any(h.all_held < h.all_runs for h in configs):
        advice.append(
            "the runs cannot tell a config that breaks the latency or error SLOs from noise; "
            "more repeats (strategy.validate.repeats) can"
        )
    if any(not h.overlength_ok for h in configs):
        # what max_model_len cuts depends on the lengths drawn, not on noise: more repeats
        # only sharpen the estimate
        advice.append(
            "the fresh samples hold more requests longer than max_model_len than "
            "slo.max_overlength_rate allows; a larger max_model_len (search.max_model_len) "
            "or limit can meet it"
        )
    why = "no config held the SLOs in every run: " + "; ".join(fails) + ". " + "; ".join(advice)
    return "undecided", None, best, why


def held_in_study(t: TrialRecord) -> bool:
    """Whether a trial's run in the study held its latency and error SLOs: it was feasible,
    or it broke only the over-length limit (validation judges that one pooled over its
    repeats, docs/tuning.md#7-validation)."""
    if t.feasible:
        return True
    low = t.headline_level()
    return (
        t.failure_class is None
        and low is not None
        and bool(low.violations)
        and all(v.get("name") == "overlength_rate" for v in low.violations)
    )
