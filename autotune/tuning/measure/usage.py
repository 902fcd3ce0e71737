"""What one worker costs on its devices, counted by the runner that starts it
(docs/cost.md#1-what-is-counted): :class:`UsageMeter` adds up a worker's start-up and the load
replayed on it between ``start`` and ``stop`` and hands the runner's caller a
:class:`~autotune.store.WorkerUsage`; :func:`sim_startup_s` is a simulated worker's modelled
start-up (:mod:`autotune.sim.startup_time`).

A real worker's lifetime is measured (launch to exit, on the host's monotonic clock). A
simulated one has no lifetime worth counting on this host, so it is charged what vLLM would
spend on the GPU: the modelled start-up plus the load it replayed, in engine seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.failures import FailureClass
from autotune.profiles.models import ModelProfile
from autotune.sim import modelled_startup
from autotune.store import WorkerUsage

__all__ = ["StartupModel", "UsageMeter", "sim_startup_s"]

# a simulated worker's start-up: (engine and static args, the failure of a failed start) -> s
StartupModel = Callable[[Mapping[str, Any], FailureClass | None], float]


def sim_startup_s(
    model: ModelProfile, args: Mapping[str, Any], failure: FailureClass | None = None
) -> float:
    """The modelled start of ``vllm serve`` with ``args`` (engine and static args together)
    on the GPU, or how far a start that failed with ``failure`` got."""
    tp = int(args.get("tensor_parallel_size") or 1)
    eager = bool(args.get("enforce_eager") or False)
    return modelled_startup(
        model, tensor_parallel_size=tp, enforce_eager=eager, failure=failure
    ).total_s


class UsageMeter:
    """One worker at a time: :meth:`begin` at its launch, :meth:`started` once it serves,
    :meth:`replayed` for each level, :meth:`split` between the runs that share it, :meth:`end`
    once it has exited."""

    def __init__(self) -> None:
        self._last: WorkerUsage | None = None
        self._open = False
        self._devices = 1
        self._startup_s: float | None = None
        self._replayed_s = 0.0
        self._charged: WorkerUsage | None = None  # what split() handed out so far

    def begin(self, devices: int) -> None:
        """A worker is being launched: from now on :attr:`last` is its cost, never an
        earlier worker's."""
        self._last = None
        self._open, self._devices = True, devices
        self._startup_s, self._replayed_s = None, 0.0
        self._charged = None

    def split(self, lifetime_s: float | None = None) -> WorkerUsage:
        """The running worker's cost since its launch or the previous split, for a run that
        is done with it while the next run keeps it (docs/cost.md#1-what-is-counted): the
        start-up goes to the first part. ``lifetime_s``: a real worker's launch-to-now
        seconds; None: a simulated one. The parts and :attr:`last` after :meth:`end` add up
        to the whole lifetime."""
        whole = self._whole(lifetime_s)
        part = _minus(whole, self._charged)
        self._charged = whole
        return part

    def started(self, startup_s: float) -> None:
        """The worker's start-up: what it reported (a real worker), or its modelled start
        on the GPU, as far as a failed start got (a simulated one)."""
        self._startup_s = startup_s

    def replayed(self, seconds: float) -> None:
        self._replayed_s += max(0.0, seconds)

    def end(self, lifetime_s: float | None = None) -> None:
        """The worker has exited. ``lifetime_s``: its measured launch-to-exit seconds (a real
        worker; its start-up is what it reported, or all of its life when it never
        served); None: a simulated worker, charged its start-up plus its load."""
        if not self._open:
            return
        self._open = False
        # after splits, what is left since the last one
        self._last = _minus(self._whole(lifetime_s), self._charged)

    def _whole(self, lifetime_s: float | None) -> WorkerUsage:
        """The worker's cost from its launch to now (``lifetime_s``: measured; None: a
        simulated worker, its start-up plus its load)."""
        if lifetime_s is None:
            startup = self._startup_s or 0.0
            return WorkerUsage(
                startup + self._replayed_s, startup, self._replayed_s, self._devices, True
            )
        startup = self._startup_s if self._startup_s is not None else lifetime_s
        return WorkerUsage(
            lifetime_s, min(startup, lifetime_s), self._replayed_s, self._devices, False
        )

    @property
    def open(self) -> bool:
        return self._open

    @property
    def last(self) -> WorkerUsage | None:
        """The last ended worker's cost (None before any)."""
        return self._last


def _minus(whole: WorkerUsage, charged: WorkerUsage | None) -> WorkerUsage:
    """``whole`` less what was already ``charged`` to earlier runs on the same worker."""
    if charged is None:
        return whole
    return WorkerUsage(
        max(0.0, whole.worker_s - charged.worker_s),
        max(0.0, whole.worker_startup_s - charged.worker_startup_s),
        max(0.0, whole.replayed_s - charged.replayed_s),
        whole.devices_held,
        whole.cost_modelled,
    )
