"""Whether a level measured the client instead of the server
(docs/loadgen.md#5-client-limited-levels).

A load generator that cannot keep up changes what the server sees: requests leave late and
bunch together (send lag), or streamed chunks pile up unread and are then read in one burst
(read gaps near zero, which also makes TPOT read near zero). Such a level's figures are the
client's, so no verdict may rest on them. :func:`check` reads the figures
:func:`autotune.loadgen.bench_stats.summarize` computes and returns a :class:`ClientLimit`
naming the bound that was passed, or None. This module owns the bounds, their words and the
stored key of the mark (``client_limit``, docs/architecture.md#4-one-owner-per-stored-key).

Only a run that went through a client is checked: a summary without ``client_loop`` (the
in-process simulator's, which has no client) is never client-limited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BOUNDS",
    "CLIENT_LIMIT_KEY",
    "LOOP_LAG_FLOOR_MS",
    "LOOP_LAG_KEY",
    "READ_GAP_FLOOR_MS",
    "SEND_LAG_FLOOR_MS",
    "SEND_LAG_GAPS",
    "Bound",
    "ClientLimit",
    "check",
    "describe",
    "host_limit_line",
    "send_lag_bound_ms",
]

# The send-lag bound: max(SEND_LAG_FLOOR_MS wall ms, SEND_LAG_GAPS mean arrival gaps), on the
# p99 of the lag (docs/loadgen.md#5-client-limited-levels says why these numbers).
SEND_LAG_FLOOR_MS = 50.0
SEND_LAG_GAPS = 2.0
# The read-gap bound: a median gap between streamed chunks below this (engine ms) means the
# chunks were read in bursts. That is the client's doing only when its own loop ran late
# (below): a server that writes its chunks together (a CPU host whose API server shares the
# cores) is read in bursts by every client, and then the bursts are what users get.
READ_GAP_FLOOR_MS = 0.1
# The client's loop ran late: the p90 of its timers' overshoot (wall ms, LoopLagProbe) at or
# above this. A loop that keeps its 10-ms timers this well reads a stream as it comes.
LOOP_LAG_FLOOR_MS = 5.0
LOOP_LAG_KEY = "p90_loop_lag_ms"  # in a client's summary

CLIENT_LIMIT_KEY = "client_limit"  # in a stored level's metrics

Bound = Literal["send_lag", "read_gap"]
BOUNDS: tuple[Bound, ...] = ("send_lag", "read_gap")


def describe(bound: str, value_ms: float, limit_ms: float) -> str:
    """The figure beside its bound in words: ``p99 send lag 450 ms > 50 ms``."""
    if bound == "send_lag":
        return f"p99 send lag {value_ms:,.0f} ms > {limit_ms:,.0f} ms"
    return f"median read gap {value_ms:.3f} ms < {limit_ms:g} ms (streamed chunks read in bursts)"


@dataclass(frozen=True)
class ClientLimit:
    """A level the client could not drive: which bound it passed, the figure and the bound
    (engine milliseconds, as the summary's figures)."""

    bound: Bound
    value_ms: float
    limit_ms: float

    @property
    def reason(self) -> str:
        """``p99 send lag 450 ms > 50 ms``."""
        return describe(self.bound, self.value_ms, self.limit_ms)

    @property
    def text(self) -> str:
        """``client-limited: p99 send lag 450 ms > 50 ms``."""
        return f"client-limited: {self.reason}"

    def stored(self) -> dict[str, Any]:
        """What a stored level's metrics keep of the mark (read back by :meth:`of`)."""
        return {
            CLIENT_LIMIT_KEY: {
                "bound": self.bound,
                "value_ms": self.value_ms,
                "limit_ms": self.limit_ms,
            }
        }

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> ClientLimit | None:
        """The mark of a stored level (its ``metrics``), None when it was not client-limited."""
        d = metrics.get(CLIENT_LIMIT_KEY)
        if not isinstance(d, Mapping) or d.get("bound") not in BOUNDS:
            return None
        bound: Bound = "send_lag" if d["bound"] == "send_lag" else "read_gap"
        return cls(bound, float(d["value_ms"]), float(d["limit_ms"]))


def send_lag_bound_ms(mean_arrival_gap_ms: float | None, time_scale: float = 1.0) -> float:
    """The p99 send lag (engine ms) above which an open-loop level is client-limited. The
    floor is wall time (a healthy client's jitter on a busy host), so it is scaled into
    engine ms for a time-scaled simulated server."""
    floor = SEND_LAG_FLOOR_MS * time_scale
    gaps = SEND_LAG_GAPS * mean_arrival_gap_ms if mean_arrival_gap_ms is not None else 0.0
    return max(floor, gaps)


def _num(s: Mapping[str, Any], key: str) -> float | None:
    v = s.get(key)
    if v is None:
        return None
    x = float(v)
    return None if x != x else x


def check(summary: Mapping[str, Any]) -> ClientLimit | None:
    """The bound ``summary`` (:func:`~autotune.loadgen.bench_stats.summarize`'s) passes, or
    None. Send lag counts only in an open loop without a concurrency cap: there the lag is
    the client's alone, whereas a closed loop's or a capped open loop's requests also wait
    for a free slot, which is the server being slow, not the client, and a burst (every
    request due at t = 0) has no schedule to keep."""
    loop = summary.get("client_loop")
    if loop is None:
        return None  # no client: the in-process simulator
    if loop == "open":
        lag = _num(summary, "p99_schedule_lag_ms")
        scale = _num(summary, "time_scale") or 1.0
        limit = send_lag_bound_ms(_num(summary, "mean_arrival_gap_ms"), scale)
        if lag is not None and lag > limit:
            return ClientLimit("send_lag", lag, limit)
    gaps = int(summary.get("itl_gaps") or 0)
    median = _num(summary, "median_itl_ms")
    # A simulated server running k times faster than wall time puts its engine steps 1/k
    # apart in wall time and writes what is due together, so its bursts are its own: the
    # read gaps say something of the client only against a server in real time, and only
    # when the client's loop ran late (a summary without the probe's figure: assume it did).
    real_time = (_num(summary, "time_scale") or 1.0) == 1.0
    loop_lag = _num(summary, LOOP_LAG_KEY)
    late = loop_lag is None or loop_lag >= LOOP_LAG_FLOOR_MS
    if real_time and late and gaps > 0 and median is not None and median < READ_GAP_FLOOR_MS:
        return ClientLimit("read_gap", median, READ_GAP_FLOOR_MS)
    return None


def host_limit_line(load: str, first: ClientLimit, second: ClientLimit, advice: str) -> str:
    """The line a run stops with when a level was client-limited twice: ``load`` says what
    was offered (``160 req/s``), ``advice`` what to lower."""
    same = first.bound == second.bound
    why = f"{second.reason}, twice" if same else f"{first.reason}, then {second.reason}"
    return (
        f"this host cannot drive {load} against the server: {why}; {advice} "
        "or run the load generator on a bigger host"
    )
