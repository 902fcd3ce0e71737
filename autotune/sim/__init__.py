"""The simulated vLLM engine: startup memory accounting, V1 scheduler, step cost model,
clocks, and its adapters to the layers below (workload requests in, records and telemetry
out). Pure logic; the HTTP server lives beside it and is the only I/O. The GPU and model
profiles it reads live in :mod:`autotune.profiles`.

This module is the front door: other packages import only the names below
(docs/architecture.md); ``autotune sim serve`` runs :mod:`autotune.sim.main` as a process.
"""

from __future__ import annotations

from autotune.sim.accuracy import PlanningError, accuracy_table, planning_error
from autotune.sim.adapters import from_sim_timeline, sim_request, sim_requests
from autotune.sim.args import EngineArgs, ResolvedArgs
from autotune.sim.frontend import DEFAULT_FRONT_END
from autotune.sim.lengths import lognormal_requests
from autotune.sim.memory import MemoryPlan, plan_memory
from autotune.sim.replay import (
    SimLevel,
    jitter_seed,
    records_from_sim,
    replay_level,
    sim_engine_args,
)
from autotune.sim.request import RequestTiming, SimRequest
from autotune.sim.result import SimResult
from autotune.sim.startup_time import StartupEstimate, modelled_startup
from autotune.sim.stop_watch import SimWatch
from autotune.sim.twin import (
    TWIN_PREFIX,
    Measured,
    Twin,
    TwinFile,
    dump_twin,
    hardware_of,
    is_twin_name,
    load_twin,
    twin_constants,
    twin_hardware,
    twin_mismatch,
)
from autotune.sim.version import ENGINE_MODEL_VERSION
from autotune.sim.virtual_loop import simulate
from autotune.sim.wire import VLLM_VERSION

__all__ = [
    "DEFAULT_FRONT_END",
    "ENGINE_MODEL_VERSION",
    "TWIN_PREFIX",
    "VLLM_VERSION",
    "EngineArgs",
    "Measured",
    "MemoryPlan",
    "PlanningError",
    "RequestTiming",
    "ResolvedArgs",
    "SimLevel",
    "SimRequest",
    "SimResult",
    "SimWatch",
    "StartupEstimate",
    "Twin",
    "TwinFile",
    "accuracy_table",
    "dump_twin",
    "from_sim_timeline",
    "hardware_of",
    "is_twin_name",
    "jitter_seed",
    "load_twin",
    "lognormal_requests",
    "modelled_startup",
    "plan_memory",
    "planning_error",
    "records_from_sim",
    "replay_level",
    "serve_main",
    "sim_engine_args",
    "sim_request",
    "sim_requests",
    "simulate",
    "twin_constants",
    "twin_hardware",
    "twin_mismatch",
]


def serve_main(argv: list[str] | None = None) -> int:
    """``autotune sim serve``: imported on call, so that importing the package does not load
    the module ``python -m autotune.sim.main`` runs."""
    from autotune.sim.main import main

    return main(argv)
