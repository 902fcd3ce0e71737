"""The simulator's measured error, as a study planned on it states it.

``accuracy.json`` beside this module is written by ``python benchmarks/sim_accuracy.py
--write`` from the held-out rows of that benchmark (measurements others published; the rows
and split in docs/simulator.md#9-accuracy-against-published-measurements). It carries the
engine fingerprint it was measured with; a test fails when the engine changes and the file
was not regenerated. Pure: :func:`planning_error` takes a GPU profile name and returns a
typed record whose :meth:`PlanningError.text` is the line ``study best``, the report, the
dashboard's study note and ``autotune sim run`` print.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from typing import Any

from autotune.errors import AutotuneError
from autotune.sim.twin import is_twin_name, load_twin

__all__ = [
    "ACCURACY_FILE",
    "AccuracyGroup",
    "AccuracyTable",
    "PlanningError",
    "accuracy_table",
    "gpu_class",
    "planning_error",
]

ACCURACY_FILE = "accuracy.json"


def gpu_class(name: str) -> str:
    """The GPU class of a profile or row name: its memory suffix dropped (``H100-80GB`` and
    ``H100`` are one class; ``A100-40GB`` and ``A100-80GB`` too)."""
    return re.sub(r"-\d+GB$", "", name, flags=re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class AccuracyGroup:
    """Mean absolute percentage errors over a group of held-out rows (None: not published)."""

    gpu_class: str | None  # None: every GPU
    bursts: bool  # all requests at once (mostly queueing), reported apart
    rows: int
    throughput_mape: float | None
    ttft_mape: float | None
    tpot_mape: float | None
    e2e_mape: float | None

    @classmethod
    def of(cls, d: dict[str, Any]) -> AccuracyGroup:
        return cls(
            gpu_class=d["gpu_class"],
            bursts=bool(d["bursts"]),
            rows=int(d["rows"]),
            throughput_mape=d["throughput_mape"],
            ttft_mape=d["ttft_mape"],
            tpot_mape=d["tpot_mape"],
            e2e_mape=d["e2e_mape"],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AccuracyTable:
    fingerprint: str
    groups: tuple[AccuracyGroup, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "groups": [g.to_dict() for g in self.groups]}

    def find(self, cls: str | None, bursts: bool) -> AccuracyGroup | None:
        return next(
            (g for g in self.groups if g.gpu_class == cls and g.bursts == bursts and g.rows),
            None,
        )


@dataclass(frozen=True, slots=True)
class PlanningError:
    """The simulator's error a study on ``hardware`` is told: the held-out rows of its GPU
    class (steady load first, bursts when that is all there is), else every steady row."""

    hardware: str
    group: AccuracyGroup | None
    own_class: bool  # the group is the hardware's own GPU class
    # when the own class has bursts only: every steady held-out row, said beside them
    steady: AccuracyGroup | None = None
    # on a calibrated profile: its own line (where it was fitted, its residuals) instead
    calibrated: str | None = None

    def text(self) -> str:
        if self.calibrated is not None:
            return self.calibrated
        g = self.group
        head = "planned on the simulator: "
        if g is None:
            return head + "its error was not measured (no held-out measurement)"
        if not self.own_class:
            return (
                f"{head}no held-out measurement on {gpu_class(self.hardware)}; "
                f"on all held-out measurements {_tput(g)} ({_detail(g)})"
            )
        out = f"{head}{_tput(g)} on held-out {g.gpu_class} measurements ({_detail(g)})"
        if self.steady is not None:
            out += (
                f"; under steady load, on all held-out measurements, {_tput(self.steady)} "
                f"({_detail(self.steady)})"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "own_class": self.own_class,
            "group": None if self.group is None else self.group.to_dict(),
            "steady": None if self.steady is None else self.steady.to_dict(),
            "calibrated": self.calibrated,
            "text": self.text(),
        }


def _tput(g: AccuracyGroup) -> str:
    if g.throughput_mape is None:
        return "its throughput error was not published"
    return f"its throughput error is ±{g.throughput_mape:.0f} %"


def _detail(g: AccuracyGroup) -> str:
    parts = [
        f"mean {name} ±{v:.0f} %"
        for name, v in (("TPOT", g.tpot_mape), ("TTFT", g.ttft_mape), ("e2e", g.e2e_mape))
        if v is not None
    ]
    rows = f"{g.rows} row{'s' if g.rows != 1 else ''}" + (", all bursts" if g.bursts else "")
    return "; ".join([rows, *parts])


@cache
def accuracy_table() -> AccuracyTable:
    """The shipped table (``accuracy.json``)."""
    text = resources.files("autotune.sim").joinpath(ACCURACY_FILE).read_text()
    d = json.loads(text)
    return AccuracyTable(d["fingerprint"], tuple(AccuracyGroup.of(g) for g in d["groups"]))


def planning_error(hardware: str, table: AccuracyTable | None = None) -> PlanningError:
    """What a study on the GPU profile ``hardware`` states about the simulator's error."""
    if is_twin_name(hardware):  # fitted to one server: its own residuals, not the rows'
        try:
            line = load_twin(hardware).text()
        except (AutotuneError, OSError) as exc:  # moved or edited since: say so, never fail
            line = f"planned on the calibrated profile {hardware} (not readable now: {exc})"
        return PlanningError(hardware, None, False, calibrated=line)
    t = accuracy_table() if table is None else table
    cls = gpu_class(hardware)
    steady = t.find(None, False)
    own = t.find(cls, False)
    if own is not None:
        return PlanningError(hardware, own, True)
    bursts = t.find(cls, True)
    if bursts is not None:  # bursts are mostly queueing: the steady rows are said beside
        return PlanningError(hardware, bursts, True, steady)
    return PlanningError(hardware, steady, False)
