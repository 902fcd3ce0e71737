"""``autotune serve`` (docs/nightly.md#9-the-service-api): auth off the loopback, each bad
input a 4xx with a JSON body that changes nothing, the allow-list for posted studies, the
OpenAPI document against the routes, every endpoint answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autotune import cli
from autotune.nightly.job_records import DecisionRecord, add_decision
from autotune.service.app import Settings, make_app, routes_of
from autotune.service.openapi import openapi_document
from autotune.service.policy import ServerWorker
from autotune.store import Store

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
YAML = {"Content-Type": "application/yaml"}

STUDY = """\
name: {name}
model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
hardware: A100-80GB
worker: {{kind: sim-virtual{worker}}}
workload: {{source: synthetic, num_prompts: 40, input_len: 256, output_len: 64,
           arrival: poisson, rate: 4{workload}}}
slo: {{p99_ttft_ms: 3000, p99_tpot_ms: 45}}
strategy: {{n_trials: 1, capacity_resolution: 0.2, validate: {{enabled: false}}}}
"""


def study(name: str = "posted", worker: str = "", workload: str = "") -> str:
    return STUDY.format(name=name, worker=worker, workload=workload)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Settings]]:
    store = Store.open(f"sqlite:///{tmp_path / 'api.db'}")
    spawned: list[str] = []

    def spawn(name: str) -> int:
        spawned.append(name)
        return 4242

    settings = Settings(store, tmp_path, TOKEN, ServerWorker(("/opt/vllm/bin/vllm",)), 4096, spawn)
    async with TestClient(TestServer(make_app(settings))) as client:
        yield client, settings
    store.close()


async def error_of(resp: Any, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert set(body) == {"error"} and body["error"]["status"] == status
    return str(body["error"]["message"])


def test_openapi_document_matches_the_routes(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'x.db'}") as store:
        app = make_app(Settings(store, tmp_path))
    doc = openapi_document()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == routes_of(app)


async def test_auth(served: tuple[TestClient[Any, Any], Settings]) -> None:
    client, _ = served
    assert (await client.get("/healthz")).status == 200  # open
    assert (await client.get("/openapi.json")).status == 200
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        resp = await client.get("/v1/studies", headers=headers)
        assert "missing or wrong bearer token" in await error_of(resp, 401)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/v1/studies", headers=AUTH)).status == 200


def test_non_loopback_bind_needs_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("AUTOTUNE_API_TOKEN", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--host", "0.0.0.0", "--storage", f"sqlite:///{tmp_path / 'a.db'}"])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1
    assert "binding beyond the loopback needs a bearer token" in err
    with pytest.raises(SystemExit) as info:  # the token file must hold one
        empty = tmp_path / "token"
        empty.write_text("\n", encoding="utf-8")
        cli.main(["serve", "--host", "0.0.0.0", "--token-file", str(empty)])
    assert info.value.code == 1 and "is empty" in capsys.readouterr().err


async def test_bad_inputs_get_4xx_json_and_change_nothing(
    served: tuple[TestClient[Any, Any], Settings],
) -> None:
    client, settings = served
    post = "/v1/studies?run=false"
    h = {**AUTH, **YAML}
    msg = await error_of(await client.post(post, data="name: [unclosed", headers=h), 400)
    assert "invalid YAML" in msg
    msg = await error_of(await client.post(post, data="name: x\n", headers=h), 400)
    assert "<posted study>" in msg
    msg = await error_of(await client.post(post, data=b"\xff\xfe", headers=h), 400)
    assert "UTF-8" in msg
    big = "# " + "x" * 5000 + "\n" + study()
    assert "exceeds" in await error_of(await client.post(post, data=big, headers=h), 413)
    resp = await client.post(post, data=study(), headers={**AUTH, "Content-Type": "image/png"})
    await error_of(resp, 415)
    await error_of(await client.get("/v1/studies/nope", headers=AUTH), 404)
    await error_of(await client.get("/v1/deployments/nope/decisions", headers=AUTH), 404)
    await error_of(await client.get("/v1/deployments/nope/recommendation", headers=AUTH), 404)
    await error_of(await client.get("/v1/nothing-here", headers=AUTH), 404)
    assert settings.store.list_studies() == []


async def test_posted_studies_allow_list(
    served: tuple[TestClient[Any, Any], Settings], tmp_path: Path
) -> None:
    client, settings = served
    h = {**AUTH, **YAML}
    forbidden = [
        (study(worker=", vllm_executable: [/bin/sh, -c, id]"), "worker.vllm_executable"),
        (study(worker=", env: {LD_PRELOAD: /tmp/x.so}"), "worker.env"),
        (study(worker=", env_passthrough: [AWS_SECRET]"), "worker.env_passthrough"),
        (study(worker=", workdir: /etc"), "outside the server's studies folder"),
        (study(worker=", workdir: ../../elsewhere"), "outside the server's studies folder"),
        (study().replace("A100-80GB", "${HOME}"), "${VAR} expansion is not allowed"),
        (study() + "storage: sqlite:////tmp/other.db\n", "storage"),
    ]
    for text, what in forbidden:
        msg = await error_of(await client.post("/v1/studies", data=text, headers=h), 403)
        assert what in msg
    assert settings.store.list_studies() == []
    resp = await client.post("/v1/studies", data=study(worker=", workdir: work"), headers=h)
    assert resp.status == 201, await resp.text()
    assert await resp.json() == {"name": "posted", "running": True, "pid": 4242}
    rec = settings.store.get_study("posted")
    assert rec is not None
    assert "/opt/vllm/bin/vllm" in rec.config_yaml  # the server's executable, not the post's
    assert str(tmp_path / "work") in rec.config_yaml
    msg = await error_of(await client.post("/v1/studies", data=study(), headers=h), 409)
    assert "already exists" in msg
    listed = await (await client.get("/v1/studies", headers=AUTH)).json()
    assert [s["name"] for s in listed["studies"]] == ["posted"]
    one = await (await client.get("/v1/studies/posted", headers=AUTH)).json()
    assert one["name"] == "posted" and one["worker"] == "sim-virtual"
    assert one["cost"]["worker_starts"] == 0 and one["cost"]["text"] == "cost: nothing counted yet"


async def test_deployments_metrics_and_health(
    served: tuple[TestClient[Any, Any], Settings],
) -> None:
    client, settings = served
    args = {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
    }
    add_decision(
        settings.store,
        DecisionRecord(
            deployment="chat",
            created_at=datetime(2026, 12, 2, 2, tzinfo=UTC),
            decision="keep",
            reason="within noise",
            incumbent=args,
            deployed=args,
            exit_code=0,
            drift={"drifted": True, "figures": {"prompt_p50": {"change_pct": 31.5}}},
            command="vllm serve m --max-model-len 4096",
        ),
    )
    rec = await (await client.get("/v1/deployments/chat/recommendation", headers=AUTH)).json()
    assert rec["engine_args"] == args and rec["vllm_serve"].startswith("vllm serve m")
    got = await (await client.get("/v1/deployments/chat/decisions", headers=AUTH)).json()
    assert [d["decision"] for d in got["decisions"]] == ["keep"]
    text = await (await client.get("/metrics", headers=AUTH)).text()
    assert 'autotune_last_decision{decision="keep",deployment="chat"} 1.0' in text
    assert 'autotune_last_decision{decision="promote",deployment="chat"} 0.0' in text
    assert 'autotune_drift_change_pct{deployment="chat",figure="prompt_p50"} 31.5' in text
    assert 'autotune_drifted{deployment="chat"} 1.0' in text
    health = await (await client.get("/healthz")).json()
    assert health == {"status": "ok", "database": "ok"}


async def test_a_posted_study_runs_in_a_child_process(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'api.db'}")
    settings = Settings(store, tmp_path, TOKEN)  # the real spawner: `autotune study run`
    try:
        async with TestClient(TestServer(make_app(settings))) as client:
            resp = await client.post("/v1/studies", data=study("child"), headers={**AUTH, **YAML})
            assert resp.status == 201, await resp.text()
            body = await resp.json()
            assert body["running"] and isinstance(body["pid"], int)
            (child,) = settings.children
            assert child.pid == body["pid"]
            assert await asyncio.to_thread(child.wait, 120) == 0
            one = await (await client.get("/v1/studies/child", headers=AUTH)).json()
        assert [t["state"] for t in one["trials"]] == ["COMPLETE"]
        assert one["best"] is not None  # the baseline, the one trial
        # what the child's worker cost, counted (docs/cost.md)
        assert one["cost"]["worker_starts"] == 1 and one["cost"]["gpu_s"] > 0
        assert "1 trial(s) run" in (tmp_path / "logs" / "child.log").read_text(encoding="utf-8")
    finally:
        store.close()
