"""One test per row of docs/style.md's error table, against the real server."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import openai
import pytest
from sparkinfer.api.errors import map_exception

from .conftest import RunningServer, serve

USER = [{"role": "user", "content": "hi"}]


def _error(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _post(server: RunningServer, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(server.v1 + path, json=body, timeout=60, **kw)


def test_malformed_json_is_400_not_422(server: RunningServer) -> None:
    resp = httpx.post(
        server.v1 + "/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    err = _error(resp)
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_value")
    assert "JSON" in err["message"]


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": []}, "messages"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"top_k": 2**63}, "top_k"),
        ({"min_tokens": 10**12}, "min_tokens"),
        ({"max_completion_tokens": 10**30}, "max_completion_tokens"),
        ({"reasoning": {"max_tokens": 10**12}}, "reasoning.max_tokens"),
    ],
)
def test_bad_field_is_400_naming_it(server: RunningServer, patch: dict, param: str) -> None:
    body = {"model": "x", "messages": USER, "max_tokens": 1, **patch}
    resp = _post(server, "/chat/completions", body)
    assert resp.status_code == 400
    err = _error(resp)
    assert (err["code"], err["param"]) == ("invalid_value", param)
    assert param.split(".")[0].split("[")[0] in err["message"]


def test_context_length_exceeded(server: RunningServer) -> None:
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    resp = _post(server, "/completions", {"model": model, "prompt": [1] * 2000, "max_tokens": 1})
    assert resp.status_code == 400
    err = _error(resp)
    assert err["code"] == "context_length_exceeded"
    assert "2000" in err["message"] and "1024" in err["message"]
    resp = _post(
        server, "/chat/completions", {"model": model, "messages": USER, "max_tokens": 5000}
    )
    assert _error(resp)["code"] == "context_length_exceeded"


def test_invalid_media(server: RunningServer) -> None:
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what"}, image]}]
    resp = _post(server, "/chat/completions", {"model": model, "messages": msgs, "max_tokens": 1})
    assert resp.status_code == 400
    err = _error(resp)
    assert (err["code"], err["param"]) == ("invalid_media", "messages[0].content[1].image_url")
    assert err["message"].startswith("messages[0].content[1].image_url ")


def test_invalid_tool_schema(server: RunningServer) -> None:
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    tools = [
        {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "bad", "parameters": {"type": "objekt"}}},
    ]
    body = {"model": model, "messages": USER, "tools": tools, "max_tokens": 1}
    resp = _post(server, "/chat/completions", body)
    assert resp.status_code == 400
    err = _error(resp)
    assert (err["code"], err["param"]) == ("invalid_tool_schema", "tools[1].function.parameters")


def test_schema_that_cannot_become_a_grammar_is_400(server: RunningServer) -> None:
    """Valid JSON Schema that xgrammar refuses (minimum above maximum) is the client's error."""
    empty_range = {"type": "integer", "minimum": 5, "maximum": 1}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": empty_range}}
    resp = _post(server, "/chat/completions", {"messages": USER, "response_format": fmt})
    assert resp.status_code == 400
    err = _error(resp)
    assert (err["code"], err["param"]) == ("invalid_value", "response_format.json_schema.schema")
    assert "minimum greater than maximum" in err["message"]
    params = {"type": "object", "properties": {"n": empty_range}, "required": ["n"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    body = {"messages": USER, "tools": tools, "tool_choice": "required"}
    resp = _post(server, "/chat/completions", body)
    assert resp.status_code == 400
    assert (_error(resp)["code"], _error(resp)["param"]) == ("invalid_tool_schema", "tools")


def test_unknown_model_is_404(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x")
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no/such-model", messages=USER, max_tokens=1)
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def _gauge(server: RunningServer, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait_for(server: RunningServer, name: str, value: float) -> None:
    for _ in range(400):
        if _gauge(server, name) >= value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {value}")


def test_queue_full_is_429_with_retry_after() -> None:
    with serve(max_num_seqs=1, max_queue_depth=1) as small:
        model = httpx.get(small.v1 + "/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "a", "max_tokens": 300, "ignore_eos": True}
        # One request runs and one waits, so the next one is refused.
        for gauge in ("sparkinfer_requests_running", "sparkinfer_requests_waiting"):
            threading.Thread(target=_post, args=(small, "/completions", body), daemon=True).start()
            _wait_for(small, gauge, 1)
        resp = _post(small, "/completions", {**body, "max_tokens": 1})
        assert resp.status_code == 429
        err = _error(resp)
        assert (err["type"], err["code"]) == ("rate_limit_error", "overloaded")
        assert int(resp.headers["retry-after"]) >= 1
        stream = _post(small, "/completions", {**body, "max_tokens": 1, "stream": True})
        assert stream.status_code == 429  # refused before the stream starts


def test_bug_is_500_internal_error_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="sparkinfer.api"):
        mapped = map_exception(KeyError("secret detail"), "req-123")
    assert mapped.status == 500
    assert mapped.body["error"]["type"] == "server_error"
    assert mapped.body["error"]["code"] == "internal_error"
    assert "secret detail" not in mapped.body["error"]["message"]
    assert "req-123" in caplog.text


def test_omitted_model_means_the_served_model(server: RunningServer) -> None:
    served = httpx.get(server.v1 + "/models", timeout=10).json()["data"][0]["id"]
    resp = _post(server, "/chat/completions", {"messages": USER, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == served


def test_huge_numbers_in_range_are_served(server: RunningServer) -> None:
    """The largest accepted values reach neither an int64 overflow nor a grammar limit."""
    body = {
        "messages": USER,
        "max_tokens": 2,
        "top_k": 2**31 - 1,
        "reasoning": {"max_tokens": 2**31 - 1},
    }
    resp = _post(server, "/chat/completions", body)
    assert resp.status_code == 200, resp.text


PRIVATE_USE = "".join(chr(c) for c in range(0xE000, 0xF900))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": PRIVATE_USE}]}),
        ("/tokenize", {"messages": [{"role": "user", "content": PRIVATE_USE}]}),
        ("/score", {"messages": [{"role": "user", "content": PRIVATE_USE}], "completion": "a"}),
    ],
)
def test_every_private_use_character_is_served(
    server: RunningServer, path: str, body: dict
) -> None:
    """The template's placeholders fall back to the supplementary private-use plane (the
    prompt is then only too long for the test server's context: tokenizing stops there)."""
    resp = _post(server, path, {**body, "max_tokens": 1} if "chat" in path else body)
    assert _error(resp)["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the request body is empty"),
        (b"[1, 2]", "the request body: "),
        (b'"text"', "the request body: "),
        (b'{"completion": "a"}', "give exactly one of prompt or messages"),
    ],
)
def test_body_level_errors_name_the_body(server: RunningServer, content: bytes, words: str) -> None:
    path = "/score" if b"completion" in content else "/chat/completions"
    resp = httpx.post(
        server.v1 + path, content=content, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    message = _error(resp)["message"]
    assert message.startswith(words) and not message.startswith(":")
