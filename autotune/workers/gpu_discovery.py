"""The devices ``autotune study run --gpus all`` runs on: the ones this process was given
(docs/scale-out.md#3-the-devices-of-a-pod).

Two pure readers and one function that does the I/O:

- :func:`from_environment` reads what the environment says: ``CUDA_VISIBLE_DEVICES`` (what
  CUDA itself honours, so it wins), then ``NVIDIA_VISIBLE_DEVICES`` (what the NVIDIA
  container runtime, and through it the Kubernetes device plugin, gave the container);
- :func:`parse_nvidia_smi_list` reads ``nvidia-smi -L``'s lines;
- :func:`find_gpus` asks the environment first and runs ``nvidia-smi -L`` only when the
  environment names no device list, and raises :class:`NoGpuError` (one line) when neither
  finds a device.

Every device comes back as a name ``CUDA_VISIBLE_DEVICES`` takes, so each lane's worker gets
exactly its share (docs/parallel.md#2-lanes).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ALL",
    "NVIDIA_SMI",
    "FoundGpus",
    "NoGpuError",
    "find_gpus",
    "from_environment",
    "parse_nvidia_smi_list",
]

ALL = "all"  # the --gpus value that asks for every device found here
NVIDIA_SMI = "nvidia-smi"

_INDEX = re.compile(r"^\d+$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
# `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-6b1a...)`, and under a GPU in MIG mode
# `  MIG 1g.10gb     Device  0: (UUID: MIG-2f3c...)`
_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9A-Za-z-]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG .*Device\s+\d+: \(UUID: (MIG-[0-9A-Za-z-]+)\)\s*$")


class NoGpuError(ValueError):
    """No device could be found; the message is one line saying where autotune looked."""


@dataclass(frozen=True)
class FoundGpus:
    """The devices found (names for ``CUDA_VISIBLE_DEVICES``) and where they came from."""

    devices: tuple[str, ...]
    source: str

    def describe(self) -> str:
        return f"{len(self.devices)} device(s) from {self.source}: {','.join(self.devices)}"


def _entries(value: str) -> list[str]:
    return [v.strip() for v in value.split(",")]


def from_environment(env: Mapping[str, str]) -> FoundGpus | None:
    """The devices the environment gives this process, or None when it names no list (the
    variables unset or empty, or ``NVIDIA_VISIBLE_DEVICES=all``: ask ``nvidia-smi``).
    :class:`NoGpuError` when it hides every device."""
    cuda = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if cuda:
        names = _entries(cuda)
        if not all(_INDEX.match(n) or _UUID.match(n) for n in names):
            # CUDA stops reading the list at the first entry it cannot use (`-1` hides all)
            raise NoGpuError(
                f"CUDA_VISIBLE_DEVICES={cuda!r} hides every device or names one CUDA cannot "
                "use: unset it, or list device indices or UUIDs"
            )
        return FoundGpus(tuple(names), "CUDA_VISIBLE_DEVICES")
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if not nvidia or nvidia == ALL:
        return None
    if nvidia in ("none", "void"):
        raise NoGpuError(
            f"NVIDIA_VISIBLE_DEVICES={nvidia!r}: the container runtime gave this container "
            "no GPU (request nvidia.com/gpu in the pod's resource limits)"
        )
    names = _entries(nvidia)
    if all(_UUID.match(n) for n in names):
        return FoundGpus(tuple(names), "NVIDIA_VISIBLE_DEVICES")
    if all(_INDEX.match(n) for n in names):
        # The runtime mounts the listed host devices and CUDA numbers what a container sees
        # from 0: host devices 2,3 are this container's 0,1 (docs/scale-out.md section 3).
        return FoundGpus(tuple(str(i) for i in range(len(names))), "NVIDIA_VISIBLE_DEVICES")
    return None  # MIG `0:1` forms, or a mix: nvidia-smi lists what is there


def parse_nvidia_smi_list(text: str) -> tuple[str, ...]:
    """The devices ``nvidia-smi -L`` lists, as UUIDs: nvidia-smi numbers GPUs in PCI bus
    order and CUDA fastest first (``CUDA_DEVICE_ORDER``), so an index could name another
    device for CUDA, a UUID never. A GPU in MIG mode is replaced by its MIG devices, the only
    ones CUDA can run on there."""
    out: list[str] = []
    migs: list[str] = []
    gpu: str | None = None

    def close() -> None:
        if gpu is not None:
            out.extend(migs or [gpu])

    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            close()
            gpu, migs = m.group(1), []
        elif (m := _MIG_LINE.match(line)) and gpu is not None:
            migs.append(m.group(1))
    close()
    return tuple(out)


def find_gpus(env: Mapping[str, str] | None = None, *, timeout_s: float = 20.0) -> FoundGpus:
    """The devices this process may use: the environment's list, else ``nvidia-smi -L``'s.
    :class:`NoGpuError` (one line) when neither names a device."""
    env = os.environ if env is None else env
    found = from_environment(env)
    if found is not None:
        return found
    where = "CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES name no device list"
    try:
        proc = subprocess.run(
            [NVIDIA_SMI, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as exc:
        raise NoGpuError(f"no GPU found: {where} and {NVIDIA_SMI} is not on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise NoGpuError(
            f"no GPU found: {NVIDIA_SMI} -L did not answer in {timeout_s:g} s"
        ) from exc
    except OSError as exc:
        raise NoGpuError(f"no GPU found: {NVIDIA_SMI} -L could not run: {exc}") from exc
    if proc.returncode != 0:
        said = next(
            (ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()), ""
        )
        raise NoGpuError(
            f"no GPU found: {NVIDIA_SMI} -L failed (exit {proc.returncode})"
            + (f": {said}" if said else "")
        )
    devices = parse_nvidia_smi_list(proc.stdout)
    if not devices:
        raise NoGpuError(f"no GPU found: {where} and {NVIDIA_SMI} -L lists none")
    return FoundGpus(devices, f"{NVIDIA_SMI} -L")
