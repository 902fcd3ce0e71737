"""What a level the early-stop rule ended measured, for every place that shows levels: the
CLI's progress lines, ``study show``, the exports and the report
(docs/tuning.md#10-early-stop-inside-a-level). Pure: takes a level's stop and figures,
returns what to show. This module also owns the stop's stored form: the ``early_stop`` key of
a stored level's metrics (:meth:`StopInfo.stored` writes it, :meth:`StopInfo.of` reads it).

A stopped level's summary (:func:`autotune.loadgen.stop_rule.stopped_summary`) holds figures
over the requests that finished by the stop. Of the level, they say only this:

- the latency it stopped on: when the summary restated it over every request sent (the
  unfinished ones at a lower bound, :attr:`StopInfo.bound`), its p99 is a lower bound and is
  shown as one ("≥");
- a rate (errors, over-length) only once the requests sent already hold more than the limit
  allows over the whole level (``count / planned > limit``, :func:`certain_rate`): the rate is
  then at least ``count / planned``. Otherwise it is not measured: the requests refused for
  length finish first, so a rate over the finished ones reads far above the level's;
- nothing over no finished request: with none, throughput and latencies are not measured
  (``vllm bench serve``'s summary says 0 for them).

A level stopped once all its requests were sent ran every request; it is not "stopped early".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LATENCIES",
    "RATES",
    "THROUGHPUTS",
    "StopInfo",
    "Stopped",
    "certain_rate",
    "stopped_figures",
    "stopped_view",
]

_KEY = "early_stop"  # the stop's key in a stored level's metrics

LATENCIES = ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms")
THROUGHPUTS = ("output_throughput", "request_throughput", "goodput", "achieved_rate")
RATES = ("error_rate", "overlength_rate")
_LABELS = {"p99_ttft": "p99 TTFT", "p99_tpot": "p99 TPOT", "error_rate": "errors"}


@dataclass(frozen=True)
class StopInfo:
    """Why and when a level stopped: ``reason`` (``p99_ttft``, ``p99_tpot``, ``error_rate``),
    ``at_request`` measured requests sent by then of ``planned``; ``bound``: the latency
    (``ttft``, ``tpot``) whose figures are over every request sent, None if none is.
    ``replay_s``: seconds replayed until the stop (the clock of the replay: wall seconds over
    HTTP, engine seconds in the simulator); ``saved_s_at_least``: seconds of arrivals the stop
    left unsent (a lower bound on the time saved). Both 0 when a record predates them."""

    reason: str
    at_request: int
    planned: int
    bound: str | None = None
    replay_s: float = 0.0
    saved_s_at_least: float = 0.0

    @classmethod
    def of(cls, metrics: Mapping[str, Any] | None) -> StopInfo | None:
        """The stop a stored level's ``metrics`` record (as :meth:`stored` wrote it); None if
        the level ran to its end."""
        d = (metrics or {}).get(_KEY)
        if not isinstance(d, Mapping):
            return None
        reason = str(d.get("reason"))
        # before ``bound`` was recorded a TTFT stop always restated p99 TTFT this way
        bound = d.get("bound", "ttft" if reason == "p99_ttft" else None)
        return cls(
            reason,
            int(d.get("at_request") or 0),
            int(d.get("planned_requests") or 0),
            bound,
            float(d.get("replay_s") or 0.0),
            float(d.get("saved_s_at_least") or 0.0),
        )

    def stored(self) -> dict[str, Any]:
        """What a stored level's ``metrics`` keep of the stop: ``{"early_stop": {...}}``, the
        shape :meth:`of` reads."""
        return {
            _KEY: {
                "reason": self.reason,
                "at_request": self.at_request,
                "planned_requests": self.planned,
                "replay_s": self.replay_s,
                "saved_s_at_least": self.saved_s_at_least,
                # the latency whose statistics are over every request sent (lower bounds)
                "bound": self.bound,
            }
        }

    @property
    def early(self) -> bool:
        """Requests were still to be sent: a level that sent them all is not stopped early."""
        return self.at_request < self.planned

    @property
    def bound_figure(self) -> str | None:
        return f"p99_{self.bound}_ms" if self.bound else None

    @property
    def text(self) -> str:
        """E.g. "stopped early on p99 TTFT at request 103 of 400"."""
        what = _LABELS.get(self.reason, self.reason)
        if self.early:
            return f"stopped early on {what} at request {self.at_request:,} of {self.planned:,}"
        return f"stopped on {what} once all {self.planned:,} requests were sent"

    @property
    def note(self) -> str:
        """:attr:`text` as a note after a level's verdict: `` (stopped early on ...)``."""
        return f" ({self.text})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "at_request": self.at_request,
            "planned_requests": self.planned,
            "early": self.early,
            "text": self.text,
        }


def certain_rate(count: int, planned: int, limit: float) -> float | None:
    """``count / planned`` when ``count`` requests already sent put the level's rate above
    ``limit`` whatever its other requests do (the rule's own test: ``count / planned >
    limit``), else None: the level may still end within it."""
    if planned <= 0 or not count / planned > limit:
        return None
    return count / planned


@dataclass(frozen=True)
class Stopped:
    """A stopped level's figures as they are to be shown: ``values`` maps each figure to its
    value, None where it is not measured; ``bounds`` the figures that are lower bounds."""

    stop: StopInfo
    values: dict[str, float | None]
    bounds: frozenset[str]

    @property
    def not_measured(self) -> list[str]:
        return [k for k, v in self.values.items() if v is None]

    def text(self, key: str, fmt: str, unit: str = "") -> str:
        """One figure in words: ``not measured``, ``≥ 3,117 ms`` or ``412 tok/s``."""
        v = self.values.get(key)
        if v is None:
            return "not measured"
        return f"{'≥ ' if key in self.bounds else ''}{v:{fmt}}{unit}"


def stopped_figures(
    metrics: Mapping[str, Any] | None,
    figures: Mapping[str, float | None],
    certain: Mapping[str, float] | None = None,
) -> Stopped | None:
    """:func:`stopped_view` of a stored level, given its ``metrics``."""
    completed = int((metrics or {}).get("completed") or 0)
    return stopped_view(StopInfo.of(metrics), completed, figures, certain)


def stopped_view(
    stop: StopInfo | None,
    completed: int,
    figures: Mapping[str, float | None],
    certain: Mapping[str, float] | None = None,
) -> Stopped | None:
    """How ``figures`` (names from :data:`LATENCIES`, :data:`THROUGHPUTS`, :data:`RATES`, as
    recorded) of a level that ``stop`` ended with ``completed`` requests finished read; None
    for a level that ran to its end. ``certain`` maps the rates already certain to break
    their limits (the level's stored violations, scored with :func:`certain_rate`) to their
    lower bounds."""
    if stop is None:
        return None
    finished = completed > 0
    values: dict[str, float | None] = {}
    bounds: set[str] = set()
    for key, value in figures.items():
        if key in RATES:
            value = (certain or {}).get(key)
            if value is not None:
                bounds.add(key)
        elif key == stop.bound_figure and value is not None:
            bounds.add(key)
        elif not finished:
            value = None  # over no finished request
        values[key] = value
    return Stopped(stop, values, frozenset(bounds))
