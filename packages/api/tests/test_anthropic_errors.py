"""Anthropic's error shape: types by status, a full queue as 529, the stream's error event."""

from __future__ import annotations

import json

from sparkinfer.api.anthropic_errors import anthropic_error, anthropic_sse_error
from sparkinfer.api.errors import InvalidRequest, Overloaded


def _openai(code: str = "invalid_value") -> dict[str, object]:
    return {
        "error": {"message": "max_tokens is required", "type": "x", "param": None, "code": code}
    }


def test_types_by_status() -> None:
    for status, kind in [
        (400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
        (413, "request_too_large"), (500, "api_error"), (503, "api_error"),
        (422, "invalid_request_error"),
    ]:  # fmt: skip
        got_status, body = anthropic_error(status, _openai())
        assert got_status == status
        assert body == {
            "type": "error",
            "error": {"type": kind, "message": "max_tokens is required"},
        }


def test_a_full_queue_is_overloaded_529() -> None:
    status, body = anthropic_error(429, _openai("overloaded"))
    assert status == 529 and body["error"]["type"] == "overloaded_error"


def test_stream_error_event() -> None:
    raw = anthropic_sse_error(InvalidRequest("bad", param="x"), "msg_1").decode()
    name, data = raw.strip().split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"},
    }  # fmt: skip
    raw = anthropic_sse_error(Overloaded("queue full"), "msg_1").decode()
    assert '"overloaded_error"' in raw
