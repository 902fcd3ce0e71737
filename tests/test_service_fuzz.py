"""schemathesis fuzzes ``autotune serve`` from its own OpenAPI document, with a bounded
number of examples per operation (the CI allowance): no 5xx, every response as documented
(status, content type, JSON error bodies)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from support.processes import free_port

from autotune.service.app import Settings, make_app
from autotune.service.openapi import openapi_document
from autotune.store import Store

TOKEN = "fuzz-token"
schema = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("fuzz")
    store = Store.open(f"sqlite:///{root / 'api.db'}")
    app = make_app(Settings(store, root, TOKEN, spawn=lambda _name: 1))
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    store.close()


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms(case: schemathesis.Case, base_url: str) -> None:
    # A posted study's body is a YAML string to the schema: a random one is rightly refused
    # (400), which the positive-data check would call a wrongly rejected valid request.
    case.call_and_validate(
        base_url=base_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        excluded_checks=[positive_data_acceptance],
    )
