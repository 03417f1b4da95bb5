"""CORS: browser preflights answered with and without an API key; origins from the setting."""

from __future__ import annotations

import httpx
import pytest
from sparkinfer.api.cors import cors_options
from starlette.middleware.cors import CORSMiddleware

from .conftest import RunningServer, serve

PREFLIGHT = {
    "Origin": "http://localhost:5173",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def _preflight(base: str, origin: str = "http://localhost:5173") -> httpx.Response:
    return httpx.options(base + "/v1/chat/completions", headers=PREFLIGHT | {"Origin": origin})


def test_preflight_without_an_api_key(server: RunningServer) -> None:
    resp = _preflight(server.base_url)
    assert resp.status_code == 200
    assert resp.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in resp.headers["access-control-allow-methods"]
    assert "authorization" in resp.headers["access-control-allow-headers"].lower()
    assert _preflight(server.base_url, "https://evil.example").status_code == 400
    # The answer itself carries the header, so the page may read it.
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    answer = httpx.post(
        server.v1 + "/chat/completions", json=body, headers={"Origin": "http://127.0.0.1:3000"}
    )
    assert answer.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()


def test_preflight_with_an_api_key_needs_no_key() -> None:
    with serve(api_key="sk-test", cors_allow_origins="*") as guarded:
        resp = _preflight(guarded.base_url, "https://app.example")
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*"
        refused = httpx.post(
            guarded.v1 + "/models", headers={"Origin": "https://app.example"}, json={}
        )
        assert refused.status_code in (401, 405)
        assert refused.headers["access-control-allow-origin"] == "*"  # the page sees why


@pytest.mark.parametrize(
    ("setting", "origin", "allowed"),
    [
        ("http://localhost:*", "http://localhost:8000", True),
        ("http://localhost:*", "http://localhost", True),
        ("http://localhost:*", "http://localhost.evil.example", False),
        ("https://a.example", "https://a.example", True),
    ],
)
def test_origin_rules(setting: str, origin: str, allowed: bool) -> None:
    options = cors_options(setting)
    assert options is not None
    middleware = CORSMiddleware(app=lambda *_: None, **options)  # type: ignore[arg-type]
    assert middleware.is_allowed_origin(origin) is allowed


def test_empty_setting_is_no_cors() -> None:
    assert cors_options("") is None
