"""/openapi.json says what the server sends: 400 not 422, the error statuses, streams as SSE."""

from __future__ import annotations

import httpx

from .conftest import RunningServer


def test_document_is_truthful(server: RunningServer) -> None:
    doc = httpx.get(server.base_url + "/openapi.json", timeout=30).json()
    text = str(doc)
    assert "'422'" not in text and "HTTPValidationError" not in text
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    for status in ("400", "401", "408", "413", "429", "500", "503", "504"):
        schema = chat[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, status
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert "text/event-stream" in completions["200"]["content"]
    assert (
        "text/event-stream"
        not in doc["paths"]["/v1/tokenize"]["post"]["responses"]["200"]["content"]
    )
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain"}
    error = doc["components"]["schemas"]["ErrorResponse"]["properties"]["error"]
    assert error["required"] == ["message", "type", "param", "code"]


def test_documented_400_is_what_comes(server: RunningServer) -> None:
    resp = httpx.post(server.v1 + "/chat/completions", json={"messages": []}, timeout=30)
    assert resp.status_code == 400 and set(resp.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
