"""Workloads: what requests to send, when, and what they look like in summary.

- sources: :func:`load_sharegpt`, :func:`random_workload` (vLLM ``random``),
  :func:`synthetic_workload` with :class:`Fixed`/:class:`Uniform`/:class:`LogNormal`/
  :class:`Empirical` lengths, :func:`sharegpt_like_workload` (built-in length profile);
- traces: :func:`load_mooncake`, :func:`load_azure`, :func:`load_trace` (column mapping);
- arrivals (:mod:`autotune.workload.arrivals`): Poisson, gamma, constant, ramp, trace scaling;
  closed loop via :meth:`Workload.closed_loop`;
- :meth:`Workload.profile` gives a :class:`WorkloadProfile` with a stable fingerprint.

Pure except for the loaders, which read one file each; bad input is a ConfigError naming
file, line and field.
"""

from __future__ import annotations

from autotune.workload import arrivals
from autotune.workload.core import Workload, WorkloadRequest
from autotune.workload.profile import LengthStats, WorkloadProfile, fingerprint, peak_rate
from autotune.workload.sources import (
    Empirical,
    Fixed,
    LengthDist,
    LogNormal,
    Uniform,
    is_valid_sequence,
    load_sharegpt,
    random_workload,
    sharegpt_like_workload,
    synthetic_workload,
)
from autotune.workload.text import (
    DEFAULT_VOCAB_SIZE,
    MOONCAKE_BLOCK_SIZE,
    TokenCounter,
    approx_token_count,
    hf_token_counter,
    text_of_length,
)
from autotune.workload.traces import (
    TRACE_FIELDS,
    dropped_text,
    load_azure,
    load_mooncake,
    load_trace,
)

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "MOONCAKE_BLOCK_SIZE",
    "TRACE_FIELDS",
    "Empirical",
    "Fixed",
    "LengthDist",
    "LengthStats",
    "LogNormal",
    "TokenCounter",
    "Uniform",
    "Workload",
    "WorkloadProfile",
    "WorkloadRequest",
    "approx_token_count",
    "arrivals",
    "dropped_text",
    "fingerprint",
    "hf_token_counter",
    "is_valid_sequence",
    "load_azure",
    "load_mooncake",
    "load_sharegpt",
    "load_trace",
    "peak_rate",
    "random_workload",
    "sharegpt_like_workload",
    "synthetic_workload",
    "text_of_length",
]
