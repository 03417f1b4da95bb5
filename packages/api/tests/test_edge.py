"""The edge, through HTTP: the key before the body, body size and read-time limits, JSON checks
off the event loop, and a 500 that keeps the connection."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from .conftest import RANDOM_MODEL_ID, RunningServer, serve

USER = [{"role": "user", "content": "hi"}]
KEY = "sk-edge"


@pytest.fixture(scope="module")
def guarded() -> Iterator[RunningServer]:
    with serve(max_num_seqs=2, api_key=KEY, max_body_bytes=4096, body_read_timeout_s=1.0) as s:
        yield s


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    pairs = [line.split(": ", 1) for line in lines[1:]]
    headers = {name.lower(): value for name, value in pairs}
    size = int(headers.get("content-length", "0"))
    while len(rest) < size:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest[:size]


def _request(path: str, body: bytes = b"", *, key: str | None = None, length: int | None = None):
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    size = len(body) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {size}\r\n\r\n"
    ).encode() + body


def test_key_is_checked_before_the_body_is_read(guarded: RunningServer) -> None:
    """A 30 MB body is announced but never sent: the 401 comes at once."""
    with _connect(guarded) as sock:
        sock.sendall(_request("/v1/chat/completions", length=30_000_000))
        status, headers, body = _read_response(sock)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_body_over_the_cap_is_413(guarded: RunningServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"messages": [{"role": "user", "content": "x" * 5000}], "max_tokens": 1}
    resp = httpx.post(guarded.v1 + "/chat/completions", json=big, headers=auth, timeout=30)
    assert resp.status_code == 413
    err = resp.json()["error"]
    assert err["code"] == "payload_too_large" and "max_body_bytes is 4096" in err["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield json.dumps(big).encode()

    resp = httpx.post(guarded.v1 + "/chat/completions", content=chunked(), headers=auth, timeout=30)
    assert resp.status_code == 413


def test_slow_body_is_408(guarded: RunningServer) -> None:
    with _connect(guarded) as sock:
        sock.sendall(_request("/v1/chat/completions", b'{"mess', key=KEY, length=100))
        start = time.monotonic()
        status, _, body = _read_response(sock)
    assert status == 408 and time.monotonic() - start < 5
    assert "body_read_timeout_s" in json.loads(body)["error"]["message"]


def test_health_needs_no_key_and_metrics_stay_open_by_default(guarded: RunningServer) -> None:
    assert httpx.get(guarded.base_url + "/health").status_code == 200
    assert httpx.get(guarded.base_url + "/metrics").status_code == 200
    assert httpx.get(guarded.v1 + "/models").status_code == 401


def test_all_routes_setting_guards_metrics_and_docs() -> None:
    with serve(api_key=KEY, api_key_all_routes=True) as s:
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert httpx.get(s.base_url + path).status_code == 401, path
            auth = {"Authorization": f"Bearer {KEY}"}
            assert httpx.get(s.base_url + path, headers=auth).status_code == 200, path
        assert httpx.get(s.base_url + "/health").status_code == 200


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"chat_template_kwargs": {"x": _nested(500)}}, "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "string", "enum": ["\udfff"]}},
                }
            },
            "response_format.json_schema.schema.enum[0]",
        ),
    ],
)
def test_deep_or_invalid_unicode_json_is_400_naming_the_field(
    server: RunningServer, patch: dict, param: str
) -> None:
    body = json.dumps({"messages": USER, "max_tokens": 1, **patch})  # \ud800 escapes stay
    resp = httpx.post(
        server.v1 + "/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param
    assert param.split(".")[0].split("[")[0] in err["message"]


def test_history_tool_call_arguments_nested_deep_are_400(server: RunningServer) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": json.dumps(_nested(500))}}
    messages = [*USER, {"role": "assistant", "tool_calls": [call]}, *USER]
    resp = httpx.post(
        server.v1 + "/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=30
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "messages[1].tool_calls[0].function.arguments"
    assert "nested deeper" in err["message"]


def test_nan_and_huge_nesting_are_400(server: RunningServer) -> None:
    for content in (b'{"messages": [], "temperature": NaN}', b"[" * 100_000 + b"]" * 100_000):
        resp = httpx.post(
            server.v1 + "/chat/completions",
            content=content,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_value"


def _boom() -> None:
    raise RuntimeError("boom: " + "x" * 10)


def test_500_keeps_the_connection_and_logs_once(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    app: FastAPI = server.app
    if not any(getattr(r, "path", None) == "/v1/boom-for-tests" for r in app.router.routes):
        # Out of the schema: the session's other tests read this app's /openapi.json.
        app.add_api_route("/v1/boom-for-tests", _boom, methods=["POST"], include_in_schema=False)
    with caplog.at_level(logging.ERROR), _connect(server) as sock:
        sock.sendall(_request("/v1/boom-for-tests", b"{}"))
        status, headers, body = _read_response(sock)
        assert status == 500 and headers.get("connection") != "close"
        assert json.loads(body)["error"]["code"] == "internal_error"
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = _read_response(sock)
        assert status == 200
    logged = [r for r in caplog.records if "boom" in r.getMessage() or r.exc_info]
    assert len(logged) == 1


def test_request_past_its_deadline_is_504_or_an_error_event() -> None:
    with serve(max_num_seqs=2, max_model_len=4096, request_timeout_s=1.0) as s:
        body = {"prompt": "def", "max_tokens": 4000, "ignore_eos": True}
        start = time.monotonic()
        resp = httpx.post(s.v1 + "/completions", json=body, timeout=60)
        assert resp.status_code == 504 and time.monotonic() - start < 10
        assert resp.json()["error"]["code"] == "request_timeout"
        with httpx.stream(
            "POST", s.v1 + "/completions", json={**body, "stream": True}, timeout=60
        ) as stream:
            lines = list(stream.iter_lines())
        assert "event: error" in lines and lines[-2:] == ["data: [DONE]", ""]
        assert httpx.get(s.base_url + "/health", timeout=10).status_code == 200
        stats = s.app.state.server.engine.engine.stats()
        deadline = time.monotonic() + 10
        while stats.num_running and time.monotonic() < deadline:  # both were aborted
            time.sleep(0.1)
            stats = s.app.state.server.engine.engine.stats()
        assert stats.num_running == 0


def test_an_anthropic_stream_past_its_deadline_ends_with_its_own_error_event() -> None:
    with serve(model=RANDOM_MODEL_ID, max_num_seqs=2, request_timeout_s=1.0) as s:
        body = {"model": RANDOM_MODEL_ID, "max_tokens": 4000, "messages": USER, "stream": True}
        with httpx.stream("POST", s.v1 + "/messages", json=body, timeout=60) as stream:
            lines = list(stream.iter_lines())
        assert "event: error" in lines and "data: [DONE]" not in lines
        error = json.loads(lines[lines.index("event: error") + 1].removeprefix("data: "))
        assert error["type"] == "error" and "request_timeout_s" in error["error"]["message"]
