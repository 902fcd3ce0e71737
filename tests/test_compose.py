"""docker-compose.yml, the Dockerfile and the compose study configs agree with each other:
services, volumes, profiles, ports, the Prometheus file_sd folder and the controller's
entry script. No Docker daemon is needed (nor available in CI); ``docker-compose config -q``
validates the file when Debian's docker-compose is installed (CI installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from support.services import need_service

from autotune.config import parse_config

ROOT = Path(__file__).parents[1]
COMPOSE = ROOT / "docker-compose.yml"
CONTROLLERS = {"controller": "sim", "controller-gpu": "gpu"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> source (named volume or host path) of a service's volumes."""
    out = {}
    for entry in service.get("volumes", []):
        parts = entry.split(":")
        out[parts[1]] = parts[0]
    return out


def _sub(text: str) -> str:
    """${VAR:-default} -> default, ${VAR:?msg} -> VAR (what compose would fill in)."""
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)
    return re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", r"\1", text)


def test_services_profiles_and_gpu_reservation(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        "postgres",
        "prometheus",
        "dashboard",
        "scheduler",
        "service",
        *CONTROLLERS,
    }
    profiles = {name: s.get("profiles") for name, s in services.items()}
    assert profiles == {
        "postgres": None,
        "prometheus": None,
        "dashboard": None,
        "controller": ["sim"],
        "controller-gpu": ["gpu"],
        "scheduler": ["sim"],
        "service": ["sim"],
    }
    gpu = services["controller-gpu"]
    assert gpu["build"]["target"] == "gpu" and services["controller"]["build"]["target"] == "sim"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in services["controller"]  # the sim profile needs no GPU
    for name in CONTROLLERS:
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy"
    assert services["postgres"]["healthcheck"]["test"][1].startswith("pg_isready")
    for name, s in services.items():
        for dep in s.get("depends_on", {}):
            assert dep in services, (name, dep)


def test_ports_are_loopback_only_and_unique(compose: dict[str, Any]) -> None:
    published = []
    for name, s in compose["services"].items():
        for port in s.get("ports", []):
            host_ip, host_port, _container = _sub(port).split(":")
            assert host_ip == "127.0.0.1", (name, port)
            published.append(host_port)
    assert sorted(published) == ["5432", "8080", "8787", "9090"]
    assert len(set(published)) == len(published)


def test_credentials_come_from_the_environment(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]["environment"]
    assert "POSTGRES_HOST_AUTH_METHOD" not in pg  # no trust auth
    assert pg["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    text = COMPOSE.read_text(encoding="utf-8")
    assert re.search(r"://[^:/@\s]+:[^$][^@\s]*@", text) is None  # no literal password in URLs
    for name in [*CONTROLLERS, "scheduler", "service"]:
        url = compose["services"][name]["environment"]["AUTOTUNE_DATABASE_URL"]
        assert "${POSTGRES_PASSWORD:?" in url and "@postgres:5432/" in url
    dashboard = compose["services"]["dashboard"]["command"]
    assert any("@postgres:5432/" in str(a) for a in dashboard)  # the study database


def test_every_volume_is_declared_and_used(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used = set()
    for s in compose["services"].values():
        for source in _mounts(s).values():
            if not source.startswith((".", "/", "$", "~")):
                used.add(source)
    assert used == declared


def test_prometheus_reads_the_repos_config_and_the_shared_targets_folder(
    compose: dict[str, Any],
) -> None:
    prom = compose["services"]["prometheus"]
    mounts = _mounts(prom)
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    in_container = config_flag.split("=", 1)[1]
    assert mounts[in_container] == "./configs/prometheus.yml"
    prom_cfg = yaml.safe_load((ROOT / "configs" / "prometheus.yml").read_text(encoding="utf-8"))
    sd_glob = prom_cfg["scrape_configs"][0]["file_sd_configs"][0]["files"][0]
    sd_dir = str(PurePosixPath(sd_glob).parent)
    volume = mounts[sd_dir]
    listen = next(a for a in prom["command"] if a.startswith("--web.listen-address="))
    prom_port = listen.rsplit(":", 1)[1]
    for name, profile in CONTROLLERS.items():
        service = compose["services"][name]
        assert _mounts(service)[sd_dir] == volume  # the same folder, shared
        study = ROOT / "configs" / f"compose-{profile}.yaml"
        default = _sub(service["environment"]["AUTOTUNE_STUDY_CONFIG"])
        assert default == f"/opt/autotune/configs/{study.name}"
        cfg = parse_config(_sub(study.read_text(encoding="utf-8")), str(study))
        assert cfg.telemetry.sd_file is not None
        assert str(PurePosixPath(cfg.telemetry.sd_file).parent) == sd_dir
        assert PurePosixPath(cfg.telemetry.sd_file).match(PurePosixPath(sd_glob).name)
        # workers bind the controller's hostname, which Prometheus resolves
        assert cfg.worker.host == service["hostname"] == "controller"
        prom_url = urlsplit(cfg.telemetry.prometheus_url or "")
        assert prom_url.hostname == "prometheus" and str(prom_url.port) == prom_port
        assert cfg.worker.kind == ("vllm" if profile == "gpu" else "sim")


def test_the_dockerfile_has_both_targets() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = dict(re.findall(r"^FROM (\S+) AS (\w+)$", text, flags=re.MULTILINE))
    assert set(stages.values()) == {"sim", "gpu"}
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:", text, flags=re.MULTILINE)
    assert "${VLLM_IMAGE}" in stages and "docker/controller.sh" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "unbuilt and untested" in readme


def _docker_compose() -> str | None:
    return shutil.which("docker-compose")


@pytest.mark.parametrize("profiles", [[], ["--profile", "sim", "--profile", "gpu"]])
def test_docker_compose_config_validates(profiles: list[str]) -> None:
    exe = _docker_compose()
    need_service("docker-compose", exe is not None, "Debian's docker-compose is not installed")
    assert exe is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTGRES_")}
    cmd = [exe, "-f", str(COMPOSE), *profiles, "config", "-q"]
    ok = subprocess.run(cmd, env={**env, "POSTGRES_PASSWORD": "t"}, capture_output=True)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


def test_the_controller_entry_script_creates_then_resumes(tmp_path: Path) -> None:
    """docker/controller.sh: `db upgrade`, create and run the first time, resume after."""
    exe = shutil.which("autotune")
    need_service("the autotune console script", exe is not None, "autotune is not on PATH")
    config = tmp_path / "s.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            name: compose-entry
            model: {name: meta-llama/Llama-3.1-8B-Instruct}
            hardware: A100-80GB
            workload: {num_prompts: 20, input_len: 128, output_len: 16, rate: 1}
            slo: {p99_ttft_ms: 5000}
            strategy: {n_trials: 3, capacity_levels: 2}
            """
        ),
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "AUTOTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 't.db'}",
        "AUTOTUNE_STUDY_CONFIG": str(config),
    }
    script = str(ROOT / "docker" / "controller.sh")
    first = subprocess.run(
        ["sh", script, "--n-trials", "1"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    assert "study 'compose-entry' created" in first.stdout and "1 trial(s) run" in first.stdout
    again = subprocess.run(
        ["sh", script, "--n-trials", "1"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout and "1 trial(s) run" in again.stdout
