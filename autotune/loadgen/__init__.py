"""Load generation: send a workload to an OpenAI-compatible server, time every request.

- :mod:`~autotune.loadgen.spec`: the ``RequestSpec`` Protocol a workload request satisfies.
- :mod:`~autotune.loadgen.client`: aiohttp streaming client (one request -> one record).
- :mod:`~autotune.loadgen.load_options`: ``LoadOptions``, what one run is asked to do.
- :mod:`~autotune.loadgen.runner`: ``run_load``, one run from its options to its result.
- :mod:`~autotune.loadgen.sender`: arrival schedule, concurrency limit, warm-up, drain.
- :mod:`~autotune.loadgen.bench_stats`: ``vllm bench serve``'s statistics over the records.
- :mod:`~autotune.loadgen.probe`: ``/v1/models`` and ``/version`` before a run.
- :mod:`~autotune.loadgen.request_log`: a level's per-request records as requests-jsonl.
"""

from __future__ import annotations

from autotune.loadgen.bench_stats import (
    DEFAULT_PERCENTILES,
    RequestRecord,
    error_kind,
    peak_concurrency,
    summarize,
    windowed,
)
from autotune.loadgen.client import DEFAULT_STALL_TIMEOUT, Endpoint, make_session, send_request
from autotune.loadgen.load_options import LoadOptions
from autotune.loadgen.probe import ServerInfo, probe_server
from autotune.loadgen.runner import LoadResult, run_load
from autotune.loadgen.sender import ProgressSnapshot
from autotune.loadgen.spec import RequestSpec

__all__ = [
    "DEFAULT_PERCENTILES",
    "DEFAULT_STALL_TIMEOUT",
    "Endpoint",
    "LoadOptions",
    "LoadResult",
    "ProgressSnapshot",
    "RequestRecord",
    "RequestSpec",
    "ServerInfo",
    "error_kind",
    "make_session",
    "peak_concurrency",
    "probe_server",
    "run_load",
    "send_request",
    "summarize",
    "windowed",
]
