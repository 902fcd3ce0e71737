"""What a workload looks like to the tuner: length percentiles, rates, concurrency, identity.

The study's search space reads the profile (e.g. ``max_model_len`` must cover the longest
request, ``max_num_seqs`` need not exceed the peak concurrency), and the fingerprint keys
results: two trials are comparable only when they ran the same workload.

Percentiles use numpy's default linear interpolation, as ``vllm bench serve`` does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from autotune.workload.core import Workload

__all__ = [
    "FINGERPRINT_VERSION",
    "LengthStats",
    "WorkloadProfile",
    "fingerprint",
    "peak_rate",
    "profile_of",
]

# Bump when the canonical serialization changes, so old and new fingerprints never collide.
FINGERPRINT_VERSION = 1


@dataclass(frozen=True)
class LengthStats:
    """Token-length summary of one quantity over all requests."""

    mean: float
    p50: float
    p95: float
    p99: float
    max: int

    @classmethod
    def of(cls, values: npt.NDArray[np.int64]) -> LengthStats:
        if values.size == 0:
            return cls(0.0, 0.0, 0.0, 0.0, 0)
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        return cls(float(values.mean()), float(p50), float(p95), float(p99), int(values.max()))


@dataclass(frozen=True)
class WorkloadProfile:
    """Summary statistics of a workload.

    Rates are None where they do not exist: a closed loop has no arrival times, and a
    workload sent all at once has no finite mean rate (its peak rates still say how hard
    the burst is). ``peak_concurrency`` is the closed loop's concurrency or a measured value.
    """

    num_requests: int
    prompt_len: LengthStats
    output_len: LengthStats
    total_len: LengthStats
    duration_s: float | None  # last arrival
    mean_rate: float | None  # requests / last arrival: vLLM's offered rate
    peak_rate_1s: float | None  # most arrivals in any 1 s window, per second
    peak_rate_10s: float | None  # same over 10 s
    peak_concurrency: int | None
    closed_loop: bool
    fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (nested dicts for the length stats)."""
        return asdict(self)


def peak_rate(times: npt.NDArray[np.float64], window: float) -> float:
    """Most arrivals in any half-open window ``[t, t + window)``, divided by ``window``.

    A maximal window can always be slid to start at an arrival, so checking the windows
    that start at each arrival is exact.
    """
    if times.size == 0:
        return 0.0
    t = np.sort(times)
    ends = np.searchsorted(t, t + window, side="left")
    return float(np.max(ends - np.arange(t.size))) / window


def profile_of(workload: Workload, peak_concurrency: int | None = None) -> WorkloadProfile:
    """The profile of ``workload``; ``peak_concurrency`` overrides the closed loop's own."""
    reqs = workload.requests
    prompt = np.fromiter((r.prompt_len for r in reqs), dtype=np.int64, count=len(reqs))
    output = np.fromiter((r.output_len for r in reqs), dtype=np.int64, count=len(reqs))
    times = workload.arrivals()
    duration = mean = peak1 = peak10 = None
    if times is not None and times.size:
        duration = float(times.max())
        mean = len(reqs) / duration if duration > 0 else None
        peak1, peak10 = peak_rate(times, 1.0), peak_rate(times, 10.0)
    return WorkloadProfile(
        num_requests=len(reqs),
        prompt_len=LengthStats.of(prompt),
        output_len=LengthStats.of(output),
        total_len=LengthStats.of(prompt + output),
        duration_s=duration,
        mean_rate=mean,
        peak_rate_1s=peak1,
        peak_rate_10s=peak10,
        peak_concurrency=(
            peak_concurrency if peak_concurrency is not None else workload.closed_loop_concurrency
        ),
        closed_loop=workload.closed_loop_concurrency is not None,
        fingerprint=fingerprint(workload),
    )


def fingerprint(workload: Workload) -> str:
    """sha256 (hex) over a canonical serialization of what the server will see.

    Included, per request in order: prompt and output length, arrival (``repr`` of the
    float: exact and the same in every process) and a digest of the stored prompt content
    (content drives prefix caching). Plus the closed-loop concurrency. Left out: request
    ids and the source description (paths differ between machines for the same workload).
    Each request is one JSON line fed to the hash, so memory stays flat for big traces.
    """
    h = hashlib.sha256()
    head = {
        "v": FINGERPRINT_VERSION,
        "closed_loop": workload.closed_loop_concurrency,
        "n": len(workload.requests),
    }
    h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for r in workload.requests:
        if r.prompt_token_ids is not None:
            ids = np.asarray(r.prompt_token_ids, dtype="<i8").tobytes()
            content = "ids:" + hashlib.sha256(ids).hexdigest()
        elif r.prompt_text is not None:
            content = "text:" + hashlib.sha256(r.prompt_text.encode()).hexdigest()
        else:
            content = ""
        arrival = None if r.arrival is None else repr(float(r.arrival))
        row = [r.prompt_len, r.output_len, arrival, content]
        h.update(json.dumps(row, separators=(",", ":")).encode() + b"\n")
    return h.hexdigest()
