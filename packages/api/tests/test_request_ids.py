"""X-Request-Id: taken from the client (sanitised, bounded) or made; on every response and log."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from fastapi import FastAPI
from sparkinfer.api.errors import InvalidRequest, install_error_handlers
from sparkinfer.api.request_ids import (
    MAX_REQUEST_ID_LEN,
    RequestIdMiddleware,
    request_id,
    sanitise_request_id,
)
from starlette.requests import Request

from .conftest import RunningServer


def test_sanitise_keeps_safe_ids_and_bounds_the_rest() -> None:
    assert sanitise_request_id("eval-42.run_1:a") == "eval-42.run_1:a"
    assert sanitise_request_id("a b\r\nX-Evil: 1") == "abX-Evil:1"
    assert len(sanitise_request_id("x" * 500)) == MAX_REQUEST_ID_LEN
    made = sanitise_request_id("\n\n")
    assert len(made) == 32 and made != sanitise_request_id(None)


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)

    @app.get("/ok")
    async def ok(request: Request) -> dict[str, str]:
        return {"id": request_id(request)}

    @app.get("/bad")
    async def bad() -> None:
        raise InvalidRequest("bad value", param="x")

    @app.get("/bug")
    async def bug() -> None:
        raise KeyError("secret")

    return app


def test_every_response_carries_the_id() -> None:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            given = {"X-Request-Id": "abc-1"}
            return [
                await client.get("/ok", headers=given),
                await client.get("/ok"),
                await client.get("/bad", headers=given),
                await client.get("/bug", headers=given),
                await client.get("/nowhere", headers=given),
            ]

    ok, made, bad, bug, missing = asyncio.run(run())
    assert ok.headers["x-request-id"] == "abc-1" == ok.json()["id"]
    assert made.headers["x-request-id"] == made.json()["id"] and len(made.json()["id"]) == 32
    assert [r.status_code for r in (bad, bug, missing)] == [400, 500, 404]
    assert all(r.headers.get_list("x-request-id") == ["abc-1"] for r in (bad, bug, missing))


def test_client_id_names_the_response_and_its_log_lines(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with caplog.at_level(logging.INFO, logger="sparkinfer.api"):
        resp = httpx.post(
            server.v1 + "/chat/completions", json=body, headers={"X-Request-Id": "eval 42"}
        )
        stream = httpx.post(
            server.v1 + "/chat/completions",
            json={**body, "stream": True},
            headers={"X-Request-Id": "eval-43"},
        )
    assert resp.headers["x-request-id"] == "eval42" and resp.json()["id"] == "chatcmpl-eval42"
    assert stream.headers["x-request-id"] == "eval-43"
    assert '"id":"chatcmpl-eval-43"' in stream.text
    assert "request chatcmpl-eval42:" in caplog.text and "request chatcmpl-eval-43:" in caplog.text
    other = httpx.post(server.v1 + "/chat/completions", json=body)
    assert other.json()["id"] == "chatcmpl-" + other.headers["x-request-id"]
