"""``autotune serve``: the HTTP API (docs/nightly.md#9-the-service-api)."""

from __future__ import annotations

import ipaddress
import os
import shlex
from pathlib import Path
from typing import Annotated

import typer

from autotune.cli._app import app
from autotune.cli.database import StorageOpt, open_store
from autotune.errors import ConfigError
from autotune.inputs import special_file

__all__ = ["TOKEN_ENV", "is_loopback", "read_token", "serve"]

TOKEN_ENV = "AUTOTUNE_API_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None) -> str | None:
    """The bearer token: ``--token-file``'s contents, else ``$AUTOTUNE_API_TOKEN`` (never
    argv, where every user of the host could read it)."""
    if token_file is not None:
        if (why := special_file(Path(token_file))) is not None:  # /dev/zero would never end
            raise ConfigError(f"--token-file: cannot read {token_file} ({why})")
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"--token-file: cannot read {token_file} ({exc.strerror})") from exc
        if not token:
            raise ConfigError(f"--token-file: {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option("--host", help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8787,
    studies_dir: Annotated[
        str, typer.Option("--studies-dir", help="posted studies' paths must lie inside it")
    ] = ".",
    token_file: Annotated[
        str | None,
        typer.Option("--token-file", help=f"the bearer token's file (else ${TOKEN_ENV})"),
    ] = None,
    vllm_executable: Annotated[
        str, typer.Option("--vllm-executable", help="the program posted vllm studies run")
    ] = "vllm",
    storage: StorageOpt = None,
) -> None:
    """Serve the HTTP API: studies, deployments' decisions, /metrics, /healthz."""
    from aiohttp import web

    from autotune.service.app import Settings, make_app
    from autotune.service.policy import ServerWorker

    token = read_token(token_file)
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host}: binding beyond the loopback needs a bearer token "
            f"(set ${TOKEN_ENV} or --token-file)"
        )
    folder = Path(studies_dir).resolve()
    if not folder.is_dir():
        raise ConfigError(f"--studies-dir: {folder} is not a folder")
    store = open_store(storage)
    settings = Settings(
        store, folder, token, ServerWorker(tuple(shlex.split(vllm_executable)) or ("vllm",))
    )
    try:
        print(f"autotune serve: http://{host}:{port} (OpenAPI at /openapi.json)", flush=True)
        web.run_app(make_app(settings), host=host, port=port, print=None)
    finally:
        store.close()
