"""The OpenAPI document as the server behaves, for the fuzzers and client generators that read it:
400 where FastAPI would say 422, every error status with the OpenAI error body, streams as
`text/event-stream` and /metrics as Prometheus text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sparkinfer.api.request_body import JsonBody

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_REF_TEMPLATE = "#/components/schemas/{model}"
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
        }
    },
}
_ERRORS = {
    "400": "Invalid request: the message names the field (`param`), the value and the limit",
    "401": "Missing or wrong API key (only when the server has one)",
    "404": "Unknown model or route",
    "408": "The request body did not arrive within body_read_timeout_s",
    "413": "The request body is larger than max_body_bytes",
    "429": "Overloaded: retry after the `Retry-After` header's seconds",
    "500": "A server bug; the request id (`X-Request-Id`) is in the server log",
    "503": "The engine has stopped, or the server is shutting down",
    "504": "The request ran longer than request_timeout_s",
}
_BODY_ERRORS = ("400", "408", "413")
_ENGINE_ERRORS = ("429", "503", "504")
_SSE = {
    "schema": {
        "type": "string",
        "description": "Server-sent events: `data: <chunk JSON>` events, `: keep-alive` "
        "comments, an `event: error` event with the error body on failure, then "
        "`data: [DONE]`",
    }
}
_OWN_ERROR_SHAPE = ("/v1/messages",)  # Anthropic's API: its own error body, documented there


def install_openapi(app: FastAPI, routers: Sequence[APIRouter] = ()) -> None:
    """Serve `truthful_openapi(app, routers)` at /openapi.json (built once, on first request);
    `routers`: those the app includes (their routes' `JsonBody` bodies are documented)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = truthful_openapi(app, routers)
        return app.openapi_schema

    app.openapi = openapi


def _body_models(routers: Sequence[APIRouter]) -> dict[tuple[str, str], type[BaseModel]]:
    """(path, method) → the body model of each route that takes one through `JsonBody`."""
    found: dict[tuple[str, str], type[BaseModel]] = {}
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute):
            continue
        for dep in route.dependant.dependencies:
            call: Any = dep.call
            if isinstance(call, JsonBody):
                model = cast("JsonBody[Any]", call).model
                for method in route.methods or ():
                    found[(route.path, method.lower())] = model
    return found


def _add_request_bodies(
    routers: Sequence[APIRouter], doc: dict[str, Any], schemas: dict[str, Any]
) -> None:
    """The routes' JSON bodies (read through `JsonBody`, so FastAPI does not see them)."""
    paths = cast("dict[str, dict[str, Any]]", doc.get("paths", {}))
    for (path, method), model in _body_models(routers).items():
        op = paths.get(path, {}).get(method)
        if op is None:
            continue
        schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
        for name, sub in cast("dict[str, Any]", schema.pop("$defs", {})).items():
            schemas.setdefault(name, sub)
        schemas.setdefault(model.__name__, schema)
        ref = {"$ref": _REF_TEMPLATE.format(model=model.__name__)}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}


def truthful_openapi(app: FastAPI, routers: Sequence[APIRouter] = ()) -> dict[str, Any]:
    """FastAPI's document with the bodies the routes read and the responses they send."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    _add_request_bodies(routers, doc, schemas)
    for path, ops in cast("dict[str, dict[str, Any]]", doc.get("paths", {})).items():
        for op in ops.values():
            _fix_operation(path, cast("dict[str, Any]", op), schemas)
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc


def _fix_operation(path: str, op: dict[str, Any], schemas: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    responses.pop("422", None)
    if path == "/metrics":
        responses["200"] = {
            "description": "Prometheus text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    if path.startswith(_OWN_ERROR_SHAPE):
        return
    has_body = "requestBody" in op
    statuses = ["500"]
    if path.startswith("/v1"):
        statuses += ["401", "404"]
    if has_body:
        statuses += [*_BODY_ERRORS, *_ENGINE_ERRORS]
    if path == "/health":
        statuses.append("503")
    for status in statuses:
        responses.setdefault(
            status,
            {
                "description": _ERRORS[status],
                "content": {"application/json": {"schema": ERROR_REF}},
            },
        )
    if has_body and _is_streamable(op, schemas):
        ok = responses.setdefault("200", {"description": "Successful Response"})
        ok.setdefault("content", {})["text/event-stream"] = _SSE


def _is_streamable(op: dict[str, Any], schemas: dict[str, Any]) -> bool:
    """Whether the request body has a `stream` field (then the answer may be an event stream)."""
    content = cast("dict[str, Any]", op["requestBody"].get("content", {}))
    schema = cast("dict[str, Any]", content.get("application/json", {}).get("schema", {}))
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = cast("dict[str, Any]", schemas.get(ref.rsplit("/", 1)[-1], {}))
    return "stream" in cast("dict[str, Any]", schema.get("properties", {}))
