"""The service's OpenAPI 3 document (served at ``/openapi.json``; a test keeps it and the
routes in sync)."""

from __future__ import annotations

from typing import Any

from autotune.service.limits import MAX_URL_BYTES

__all__ = ["openapi_document"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "message"],
            "properties": {"status": {"type": "integer"}, "message": {"type": "string"}},
        }
    },
}
_OBJ: dict[str, Any] = {"type": "object"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "bad input",
        401: "missing or wrong bearer token",
        403: "a forbidden field",
        404: "not found",
        409: "already exists",
        413: "body too large",
        414: f"URL over {MAX_URL_BYTES:,} bytes",
        415: "not YAML",
    }
    return {str(c): _json({"$ref": "#/components/schemas/Error"}, words[c]) for c in codes}


def _name(what: str) -> dict[str, Any]:
    return {
        "name": "name",
        "in": "path",
        "required": True,
        "description": what,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
    }


def openapi_document() -> dict[str, Any]:
    auth: list[dict[str, list[str]]] = [{"bearer": []}]
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "summary": "liveness and database reachability",
                "security": [],
                "responses": {"200": _json(_OBJ, "ok"), "503": _json(_OBJ, "database down")},
            }
        },
        "/metrics": {
            "get": {
                "summary": "the tuner's metrics (Prometheus text format)",
                "security": auth,
                "responses": {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors(401),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "security": [],
                "responses": {"200": _json(_OBJ, "the OpenAPI document")},
            }
        },
        "/v1/studies": {
            "get": {
                "summary": "every study",
                "security": auth,
                "responses": {"200": _json(_OBJ, "the studies"), **_errors(401)},
            },
            "post": {
                "summary": "create a study from YAML and run it in a child process",
                "security": auth,
                "parameters": [
                    {
                        "name": "run",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "boolean", "default": True},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/yaml": {"schema": {"type": "string"}}},
                },
                "responses": {
                    "201": _json(_OBJ, "created"),
                    **_errors(400, 401, 403, 409, 413, 415),
                },
            },
        },
        "/v1/studies/{name}": {
            "get": {
                "summary": "one study: its trials, recommendation and device time",
                "security": auth,
                "parameters": [_name("the study")],
                "responses": {"200": _json(_OBJ, "the study"), **_errors(401, 404, 414)},
            }
        },
        "/v1/deployments/{name}/recommendation": {
            "get": {
                "summary": "the config in use after the latest nightly decision",
                "security": auth,
                "parameters": [_name("the deployment")],
                "responses": {"200": _json(_OBJ, "the config"), **_errors(401, 404, 414)},
            }
        },
        "/v1/deployments/{name}/decisions": {
            "get": {
                "summary": "a deployment's nightly decisions, oldest first",
                "security": auth,
                "parameters": [_name("the deployment")],
                "responses": {"200": _json(_OBJ, "the decisions"), **_errors(401, 404, 414)},
            }
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "autotune", "version": "1", "description": "docs/nightly.md"},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
