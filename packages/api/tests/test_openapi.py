"""/openapi.json says what the server sends: 400 not 422, the error statuses, streams as SSE;
schemathesis, bounded and seeded, finds no 5xx through it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .conftest import RunningServer, serve


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


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[RunningServer]:
    # A short context: generated max_tokens either fail the context check or finish quickly.
    with serve(max_num_seqs=4, max_model_len=96, request_timeout_s=20) as s:
        yield s


def test_fuzzed_requests_never_get_a_5xx(fuzzed: RunningServer) -> None:
    """A bounded schemathesis run over our own document, every operation with a fixed seed; no
    answer is a 5xx and the server stays healthy."""
    api = schemathesis.openapi.from_url(fuzzed.base_url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) > 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=20,
            derandomize=True,  # a fixed seed: the same cases on every run
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: Any) -> None:
            response = case.call(base_url=fuzzed.base_url, timeout=60)
            assert response.status_code < 500, (case.method, case.path, response.text[:500])

        check()
    assert httpx.get(fuzzed.base_url + "/health", timeout=10).status_code == 200


def test_every_body_route_documents_its_request_and_response(server: RunningServer) -> None:
    doc = httpx.get(server.base_url + "/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in ("post", "put", "patch"):
                continue
            body = op["requestBody"]["content"]["application/json"]["schema"]
            assert body["$ref"].rsplit("/", 1)[-1] in schemas, (path, body)
            ok = op["responses"]["200"]["content"]["application/json"]["schema"]
            assert ok, (path, method)
    messages = doc["paths"]["/v1/messages"]["post"]
    assert messages["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessagesRequest"
    }
    assert (
        "text/event-stream" in doc["paths"]["/v1/responses"]["post"]["responses"]["200"]["content"]
    )
