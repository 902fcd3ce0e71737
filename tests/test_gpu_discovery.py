"""``autotune study run --gpus all`` (docs/scale-out.md#3-the-devices-of-a-pod): the devices
come from the environment (``CUDA_VISIBLE_DEVICES``, then ``NVIDIA_VISIBLE_DEVICES``), else
from ``nvidia-smi -L`` (here a fake one on PATH), and a host without any gets one line."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from support.studies import config

from autotune import cli
from autotune.config import parse_config
from autotune.errors import ConfigError
from autotune.tuning.run.lanes import parse_devices
from autotune.workers.gpu_discovery import (
    FoundGpus,
    NoGpuError,
    find_gpus,
    from_environment,
    parse_nvidia_smi_list,
)

U0 = "GPU-6b1a2f5e-0000-4000-8000-000000000000"
U1 = "GPU-1a2b3c4d-1111-4111-8111-111111111111"
M0 = "MIG-2f3c4d5e-2222-4222-8222-222222222222"
M1 = "MIG-3a4b5c6d-3333-4333-8333-333333333333"

SMI_TWO = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {U0})\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: {U1})\n"
SMI_MIG = (
    f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {U0})\n"
    f"  MIG 3g.40gb     Device  0: (UUID: {M0})\n"
    f"  MIG 3g.40gb     Device  1: (UUID: {M1})\n"
    f"GPU 1: NVIDIA A100-SXM4-80GB (UUID: {U1})\n"
)


# -- pure parsing ----------------------------------------------------------------------------


def test_nvidia_smi_lines_give_uuids_and_mig_devices_replace_their_gpu() -> None:
    assert parse_nvidia_smi_list(SMI_TWO) == (U0, U1)
    assert parse_nvidia_smi_list(SMI_MIG) == (M0, M1, U1)
    assert parse_nvidia_smi_list("") == ()
    # a MIG line with no GPU before it, and chatter, are not devices
    assert parse_nvidia_smi_list(f"  MIG 1g.10gb Device 0: (UUID: {M0})\nNo devices found.\n") == ()


@pytest.mark.parametrize(
    ("env", "devices", "source"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, ("2", "3"), "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": f"{U1}, {U0}"}, (U1, U0), "CUDA_VISIBLE_DEVICES"),
        # CUDA's own list wins over what the runtime mounted
        (
            {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": U0},
            ("1",),
            "CUDA_VISIBLE_DEVICES",
        ),
        ({"NVIDIA_VISIBLE_DEVICES": f"{U0},{U1}"}, (U0, U1), "NVIDIA_VISIBLE_DEVICES"),
        # host indices 4,6 mounted into a container are its devices 0,1
        ({"NVIDIA_VISIBLE_DEVICES": "4,6"}, ("0", "1"), "NVIDIA_VISIBLE_DEVICES"),
    ],
)
def test_the_environment_names_the_devices(
    env: dict[str, str], devices: tuple[str, ...], source: str
) -> None:
    assert from_environment(env) == FoundGpus(devices, source)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"CUDA_VISIBLE_DEVICES": " "},
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        {"NVIDIA_VISIBLE_DEVICES": "0:1,0:2"},
    ],
)
def test_an_environment_without_a_list_defers_to_nvidia_smi(env: dict[str, str]) -> None:
    assert from_environment(env) is None


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"CUDA_VISIBLE_DEVICES": "-1"}, "CUDA_VISIBLE_DEVICES='-1' hides every device"),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, "gave this container no GPU"),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, "request nvidia.com/gpu"),
    ],
)
def test_an_environment_that_hides_every_device_is_one_line(
    env: dict[str, str], words: str
) -> None:
    with pytest.raises(NoGpuError) as info:
        from_environment(env)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_all_is_never_taken_for_a_device_name() -> None:
    with pytest.raises(ValueError, match="'all' names no device"):
        parse_devices("all")


# -- the I/O path: a fake nvidia-smi on PATH -------------------------------------------------


def fake_smi(folder: Path, out: str, code: int = 0) -> Path:
    """An ``nvidia-smi`` that prints ``out`` for ``-L`` (and exits ``code``); any other
    arguments are a usage error, so a wrong call cannot pass."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""\
            import sys
            if sys.argv[1:] != ["-L"]:
                sys.exit(2)
            sys.stdout.write({out!r})
            sys.exit({code})
            """
        ),
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_env")
def test_nvidia_smi_on_path_is_asked_when_the_environment_names_no_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin", SMI_TWO)))
    assert find_gpus() == FoundGpus((U0, U1), "nvidia-smi -L")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")  # the CUDA images' default
    assert find_gpus().devices == (U0, U1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the environment first: no subprocess
    assert find_gpus() == FoundGpus(("0",), "CUDA_VISIBLE_DEVICES")


@pytest.mark.usefixtures("no_env")
@pytest.mark.parametrize(
    ("smi", "words"),
    [
        (None, "nvidia-smi is not on PATH"),
        (
            ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9),
            "nvidia-smi -L failed (exit 9): NVIDIA-SMI has failed",
        ),
        (("No devices found.\n", 0), "nvidia-smi -L lists none"),
    ],
)
def test_no_device_anywhere_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    smi: tuple[str, int] | None,
    words: str,
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty if smi is None else fake_smi(empty, *smi)))
    with pytest.raises(NoGpuError) as info:
        find_gpus()
    message = str(info.value)
    assert message.startswith("no GPU found: ") and words in message and "\n" not in message


# -- the command line --------------------------------------------------------------------------


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.usefixtures("no_env")
def test_study_run_gpus_all_resolves_before_the_lane_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin", SMI_TWO)))
    monkeypatch.delenv("AUTOTUNE_DATABASE_URL", raising=False)
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    # two devices found: three per trial cannot divide them, said with the devices found
    code, out, err = run_main(
        ["study", "run", "s", "--storage", storage, "--gpus", "all", "--gpus-per-trial", "3"],
        capsys,
    )
    assert code == 2, err
    assert f"--gpus all: 2 device(s) from nvidia-smi -L: {U0},{U1}" in out
    assert f"3 does not divide the 2 device(s) of --gpus {U0},{U1}" in err
    # and with the devices the pod's environment names, the run goes on to find the study
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "5,7")
    code, out, err = run_main(["study", "run", "s", "--storage", storage, "--gpus", "all"], capsys)
    assert "--gpus all: 2 device(s) from NVIDIA_VISIBLE_DEVICES: 0,1" in out
    assert code == 4 and "no study named 's'" in err, err


@pytest.mark.usefixtures("no_env")
def test_study_run_gpus_all_without_a_device_is_one_usage_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", os.fspath(tmp_path))  # no nvidia-smi here
    monkeypatch.delenv("AUTOTUNE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # where the default sqlite:///autotune.db would land
    code, _out, err = run_main(["study", "run", "s", "--gpus", "all"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "error: autotune study run: Invalid value for '--gpus': all: no GPU found: "
        "CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES name no device list and nvidia-smi "
        "is not on PATH (see `autotune study run --help`)"
    ]
    assert not (tmp_path / "autotune.db").exists()


@pytest.mark.config_field("worker.gpus")
def test_worker_gpus_all_in_a_config_is_refused_with_the_flag_to_use() -> None:
    # CUDA_VISIBLE_DEVICES=all would hide every device: the config names devices, the run
    # resolves `--gpus all`
    base, _ = config()
    d = base.model_dump(mode="json", by_alias=True, exclude_unset=True)
    d["worker"] = {"kind": "vllm", "gpus": "all"}
    with pytest.raises(ConfigError, match=r"^g\.yaml:\d+: worker\.gpus: .*--gpus all"):
        parse_config(yaml.safe_dump(d), "g.yaml")
