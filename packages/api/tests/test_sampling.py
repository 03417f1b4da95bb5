"""Sampling fields at the edge: the logit_bias cap and the one token-id rule, through HTTP."""

from __future__ import annotations

import httpx
import pytest

from .conftest import RunningServer

USER = [{"role": "user", "content": "hi"}]


def _post(server: RunningServer, path: str, body: object) -> httpx.Response:
    return httpx.post(server.v1 + path, json=body, timeout=60)


def _vocab_size(server: RunningServer) -> int:
    return server.app.state.server.tokenizer.vocab_size


def test_logit_bias_over_the_cap_is_400(server: RunningServer) -> None:
    bias = {str(i): 1.0 for i in range(301)}
    resp = _post(
        server, "/chat/completions", {"messages": USER, "max_tokens": 1, "logit_bias": bias}
    )
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "logit_bias"
    assert "301" in err["message"] and "300" in err["message"]
    bias = {str(i): 1.0 for i in range(300)}
    resp = _post(
        server, "/chat/completions", {"messages": USER, "max_tokens": 1, "logit_bias": bias}
    )
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"prompt": [1, "PAD"], "max_tokens": 1}, "prompt"),
        ("/completions", {"prompt": [1, "PAD"], "max_tokens": 1, "echo": True}, "prompt"),
        (
            "/completions",
            {"prompt": "hi", "max_tokens": 1, "stop_token_ids": ["PAD"]},
            "stop_token_ids",
        ),
        ("/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {"KEY": 1}}, "logit_bias"),
        ("/score", {"prompt": [1], "completion": ["PAD"]}, "completion"),
        ("/detokenize", {"tokens": [1, "PAD"]}, "tokens"),
    ],
)
def test_one_token_id_rule_one_message(
    server: RunningServer, path: str, body: dict, param: str
) -> None:
    """An id past the tokenizer's (a padding id of the model, or beyond) is refused alike."""
    pad = _vocab_size(server)
    text = (
        httpx.Request("POST", "/", json=body)
        .content.decode()
        .replace('"PAD"', str(pad))
        .replace("KEY", str(pad))
    )
    resp = httpx.post(
        server.v1 + path, content=text, headers={"content-type": "application/json"}, timeout=60
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param
    assert f"token id {pad}," in err["message"] and "/v1/tokenize" in err["message"]
