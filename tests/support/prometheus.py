"""A real Prometheus (Debian's package) on a free loopback port, with a generated config that
scrapes every ``*.json`` target file in a file_sd folder each ``INTERVAL`` seconds, and a temp
storage folder; killed in teardown. Fixtures ``prometheus_bin`` and ``prometheus`` (registered
in tests/conftest.py); without the binary they skip, or fail under CI=true.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .processes import free_port
from .services import need_service

__all__ = ["INTERVAL", "prometheus", "prometheus_bin", "wait_ready"]

INTERVAL = 0.5  # Prometheus's scrape interval (tests scrape directly at the same interval)


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    need_service(
        "prometheus", path is not None, "no prometheus binary on PATH (apt-get install prometheus)"
    )
    assert path is not None
    return path


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, file_sd folder) of a fresh Prometheus; killed afterwards."""
    sd = tmp_path / "sd"
    sd.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""\
global:
  scrape_interval: {INTERVAL * 1000:.0f}ms
  scrape_timeout: {INTERVAL * 1000:.0f}ms
scrape_configs:
  - job_name: autotune
    file_sd_configs:
      - files: ["{sd}/*.json"]
""")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, tmp_path / "prometheus.log")
        yield url, sd
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"Prometheus at {url} not ready: {log.read_text()[-500:]}")
