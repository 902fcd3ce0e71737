"""The aiohttp application of ``autotune serve`` (docs/nightly.md#9-the-service-api).

Every error is a 4xx (or 5xx) with a JSON body ``{"error": {"status", "message"}}`` and
changes nothing. With a token configured every route but ``/healthz`` and
``/openapi.json`` needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from autotune.config import parse_config
from autotune.errors import AutotuneError, ConfigError, StorageError
from autotune.inputs import clip
from autotune.nightly.job_records import decisions
from autotune.report.best_output import best_json
from autotune.report.recommend import recommend
from autotune.report.tables import list_json, show_rows
from autotune.service.limits import handler_args, url_limit
from autotune.service.openapi import openapi_document
from autotune.service.policy import PolicyError, ServerWorker, apply_policy
from autotune.service.tuner_metrics import metrics_text
from autotune.store import Store
from autotune.store.db import ENV_VAR
from autotune.tuning.measure.cost import study_cost
from autotune.tuning.run.create import create_study, load_study_config
from autotune.tuning.study_attrs import stored_noise

__all__ = ["MAX_BODY", "ROUTES", "Settings", "child_spawner", "make_app", "routes_of"]

log = logging.getLogger(__name__)
MAX_BODY = 256 * 1024
_OPEN = {"/healthz", "/openapi.json"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Spawn = Callable[[str], int]


@dataclass
class Settings:
    store: Store
    studies_dir: Path
    token: str | None = None
    worker: ServerWorker = field(default_factory=ServerWorker)
    max_body: int = MAX_BODY
    spawn: Spawn | None = None  # runs a created study in a child process; returns its pid
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)


_SETTINGS = web.AppKey("settings", Settings)


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"status": status, "message": clip(message)}}
    return web.json_response(body, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        resp = _error(exc.status, exc.text or exc.reason or "error")
        for key in ("Allow", "WWW-Authenticate", "Retry-After"):  # e.g. 405's Allow
            if key in exc.headers:
                resp.headers[key] = exc.headers[key]
        return resp
    except AutotuneError as exc:
        return _error(400, " ".join(str(exc).split()))


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[_SETTINGS].token
    if token is not None and request.path not in _OPEN:
        got = request.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            resp = _error(401, "missing or wrong bearer token")
            resp.headers["WWW-Authenticate"] = "Bearer"
            return resp
    return await handler(request)


def _store(request: web.Request) -> Store:
    return request.app[_SETTINGS].store


async def _healthz(request: web.Request) -> web.Response:
    try:
        await asyncio.to_thread(_store(request).list_studies)
    except AutotuneError as exc:
        return web.json_response({"status": "error", "database": str(exc)}, status=503)
    return web.json_response({"status": "ok", "database": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(metrics_text, _store(request))
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def _list_studies(request: web.Request) -> web.Response:
    rows = await asyncio.to_thread(_store(request).list_studies)
    return web.json_response(list_json(rows))


def _study(store: Store, name: str) -> dict[str, Any] | None:
    rec = store.get_study(name)
    if rec is None:
        return None
    trials = store.trials(name, with_levels=False)
    repeats = store.repeats(name)
    cfg = load_study_config(rec)
    best = recommend(cfg, trials, repeats, stored_noise(store, name))
    return {
        "name": name,
        "mode": rec.mode,
        "worker": rec.worker_kind,
        "trials": show_rows(trials, rec.mode),
        "best": best_json(name, best) if best is not None else None,
        "cost": study_cost(trials, repeats).to_dict(),  # docs/cost.md
    }


async def _get_study(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    got = await asyncio.to_thread(_study, _store(request), name)
    if got is None:
        return _error(404, f"no study named {name!r}")
    return web.json_response(json.loads(json.dumps(got, default=str)))


async def _post_study(request: web.Request) -> web.Response:
    s = request.app[_SETTINGS]
    if request.content_length is not None and request.content_length > s.max_body:
        return _error(413, f"the body exceeds {s.max_body} bytes")
    ctype = request.content_type
    if ctype not in ("application/yaml", "application/x-yaml", "text/yaml", "text/plain"):
        return _error(415, f"send the study config as application/yaml, not {ctype}")
    raw = await request.read()
    if len(raw) > s.max_body:
        return _error(413, f"the body exceeds {s.max_body} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _error(400, "the body is not UTF-8 text")
    run = request.query.get("run", "true").lower() not in ("false", "0", "no")
    try:
        if "${" in text:
            raise PolicyError("${VAR} expansion is not allowed in a posted study")
        parse_config(text, "<posted study>")
        data = apply_policy(text, s.studies_dir, s.worker)
        final = yaml.safe_dump(data, sort_keys=False)
        cfg = parse_config(final, "<posted study>")
    except PolicyError as exc:
        return _error(403, str(exc))
    except ConfigError as exc:
        return _error(400, str(exc))
    try:
        rec = await asyncio.to_thread(create_study, cfg, final, s.store)
    except StorageError as exc:
        status = 409 if "already exists" in str(exc) else 400
        return _error(status, str(exc))
    pid = s.spawn(rec.name) if run and s.spawn is not None else None
    return web.json_response({"name": rec.name, "running": pid is not None, "pid": pid}, status=201)


def _deployment(store: Store, name: str) -> list[dict[str, Any]]:
    return [d.to_dict() for d in decisions(store, name)]


async def _deployment_decisions(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    rows = await asyncio.to_thread(_deployment, _store(request), name)
    if not rows:
        return _error(404, f"deployment {name!r} has no decisions")
    return web.json_response({"deployment": name, "decisions": rows})


async def _deployment_recommendation(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    rows = await asyncio.to_thread(_deployment, _store(request), name)
    if not rows:
        return _error(404, f"deployment {name!r} has no decisions")
    last = rows[-1]
    return web.json_response(
        {
            "deployment": name,
            "engine_args": last["deployed"],
            "vllm_serve": last["command"],
            "decision": last["decision"],
            "decided_at": last["created_at"],
            "study": last["study_name"],
        }
    )


def child_spawner(settings: Settings) -> Spawn:
    """Run ``autotune study run NAME`` in a child process (the database URL in its
    environment), its output in ``<studies_dir>/logs/NAME.log``."""

    def spawn(name: str) -> int:
        logs = settings.studies_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.cli", "study", "run", name],
                env={**os.environ, ENV_VAR: settings.store.url},
                cwd=settings.studies_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        settings.children = [c for c in settings.children if c.poll() is None] + [proc]
        return proc.pid

    return spawn


ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/healthz", _healthz),
    ("GET", "/metrics", _metrics),
    ("GET", "/openapi.json", _openapi),
    ("GET", "/v1/studies", _list_studies),
    ("POST", "/v1/studies", _post_study),
    ("GET", "/v1/studies/{name}", _get_study),
    ("GET", "/v1/deployments/{name}/recommendation", _deployment_recommendation),
    ("GET", "/v1/deployments/{name}/decisions", _deployment_decisions),
]


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route (HEAD, which aiohttp adds for GET, left out)."""
    out = set()
    for r in app.router.routes():
        info = r.resource.get_info() if r.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if r.method != "HEAD" and path:
            out.add((r.method, str(path)))
    return out


def make_app(settings: Settings) -> web.Application:
    app = web.Application(
        middlewares=[_errors, url_limit(_error), _auth],
        client_max_size=settings.max_body,
        handler_args=handler_args(),
    )
    app[_SETTINGS] = settings
    if settings.spawn is None:
        settings.spawn = child_spawner(settings)
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    return app
