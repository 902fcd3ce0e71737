"""A private PostgreSQL cluster for fault injection: the shared server on 5432 is never
stopped or restarted by a test.

``initdb`` refuses to run as root (CI runs as root), so under root every PostgreSQL program
runs as the ``postgres`` user through ``runuser``, in a folder that user owns. The cluster
listens on a free loopback port with trust authentication and durability off (fsync,
synchronous commit): it only has to survive restarts, not power cuts.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from autotune.workers.procstat import is_alive

from .processes import free_port

__all__ = ["PgCluster", "find_pg_bin", "start_cluster"]


def find_pg_bin() -> Path | None:
    """The folder of ``initdb``/``pg_ctl``: Debian's newest version, else ``$PATH``."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


@dataclass
class PgCluster:
    bin: Path
    root: Path  # owned by the server's user: data/, the socket and the log
    port: int
    runas: list[str]  # ["runuser", "-u", "postgres", "--"] under root

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run([*self.runas, *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {proc.stdout[-800:]}{proc.stderr[-800:]}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _libpq(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        pg_ctl = str(self.bin / "pg_ctl")
        log = str(self.root / "server.log")
        self._run(pg_ctl, "-D", str(self.data), "-l", log, "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float) -> float:
        """Stop the server, keep it down ``down_s`` seconds, start it; returns the seconds
        it was unreachable."""
        t0 = time.monotonic()
        self.stop()
        time.sleep(down_s)
        self.start()
        return time.monotonic() - t0

    def create_database(self, name: str) -> str:
        with psycopg.connect(self._libpq(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster: nothing to keep), then remove it."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _running(pid):
                time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: this process may have adopted the
    postmaster as a child subreaper, so it is reaped here)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return is_alive(pid)


def start_cluster() -> PgCluster | str:
    """A started private cluster, or why there cannot be one here."""
    pg_bin = find_pg_bin()
    if pg_bin is None or not (pg_bin / "pg_ctl").exists():
        return "no initdb/pg_ctl (PostgreSQL server programs) installed"
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    runas: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            return "running as root and there is no 'postgres' user to run initdb as"
        os.chown(root, user.pw_uid, user.pw_gid)
        runas = ["runuser", "-u", "postgres", "--"]
    cluster = PgCluster(pg_bin, root, free_port(), runas)
    try:
        cluster._run(
            str(pg_bin / "initdb"),
            "-D",
            str(cluster.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        cluster.start()
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        cluster.destroy()
        return f"could not start a private PostgreSQL cluster: {exc}"
    return cluster
