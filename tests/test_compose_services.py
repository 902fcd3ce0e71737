"""The compose file's `scheduler` and `service` commands, started as processes here (no
Docker daemon: the commands themselves, with the database and port swapped for local
ones)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from support.processes import free_port

ROOT = Path(__file__).parents[1]


def compose_argv(service: str) -> list[str]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    s = data["services"][service]
    argv = [*s["entrypoint"], *s["command"]]
    assert argv[0] == "autotune"
    return [sys.executable, "-m", "autotune.cli", *argv[1:]]


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_API_TOKEN"}
    return {**env, "AUTOTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}", **extra}


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_scheduler_service_command(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    proc = subprocess.Popen(
        compose_argv("scheduler"), env=env, cwd=tmp_path, text=True, stderr=subprocess.PIPE
    )
    try:
        # it says when it holds the lock; probing before that could take the lock first
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("scheduler: active"), line
        other = subprocess.run(
            [sys.executable, "-m", "autotune.cli", "scheduler", "--once"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert other.returncode == 6, other.stderr
        assert other.stderr.startswith("error: another autotune scheduler is active")
        assert proc.poll() is None
    finally:
        code = stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 0


def test_the_api_service_command(tmp_path: Path) -> None:
    port = free_port()
    argv = swap(swap(compose_argv("service"), "--port", str(port)), "--studies-dir", str(tmp_path))
    refused = subprocess.run(argv, env=env_for(tmp_path), capture_output=True, text=True)
    assert refused.returncode == 1 and "needs a bearer token" in refused.stderr
    proc = subprocess.Popen(argv, env=env_for(tmp_path, AUTOTUNE_API_TOKEN="tok"), text=True)
    try:
        deadline, status = time.monotonic() + 30, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200 and body == {"status": "ok", "database": "ok"}
        assert get(f"http://127.0.0.1:{port}/v1/studies")[0] == 401
        code, listed = get(f"http://127.0.0.1:{port}/v1/studies", "tok")
        assert code == 200 and listed["studies"] == []
    finally:
        stop(proc)
