"""Hostile requests never pause other clients: each runs while another client streams, and that
stream's longest pause must stay under MAX_GAP_S (the event loop and the global lock stay free)."""

from __future__ import annotations

import httpx

from .conftest import RunningServer, stream_gap_during

MAX_GAP_S = 0.5


def test_a_4mb_prompt_is_refused_for_length_without_pausing_streams(
    server: RunningServer,
) -> None:
    prompt = "hello world, a long prompt " * 150_000  # 4 MB

    def hostile() -> httpx.Response:
        return httpx.post(server.v1 + "/tokenize", json={"prompt": prompt}, timeout=60)

    gap, resp = stream_gap_during(server.base_url, hostile)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert gap < MAX_GAP_S


def _post_raw(server: RunningServer, path: str, data: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(server.v1 + path, content=data, headers=headers, timeout=120)


def test_a_huge_logit_bias_is_refused_before_validation(server: RunningServer) -> None:
    # 200,000 entries whose values are not even numbers: the size cap answers first.
    bias = ",".join(f'"{i}": "x"' for i in range(200_000))
    data = b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {%s}}' % bias.encode()
    gap, resp = stream_gap_during(
        server.base_url, lambda: _post_raw(server, "/chat/completions", data)
    )
    err = resp.json()["error"]
    assert resp.status_code == 400 and err["param"] == "logit_bias"
    assert "200000 entries" in err["message"]
    assert gap < MAX_GAP_S


def test_a_body_of_millions_of_values_is_refused_before_parsing(server: RunningServer) -> None:
    arrays = b",".join([b"[]"] * 10_000_000)  # 30 MB
    data = b'{"prompt": "x", "ignored": [%s]}' % arrays
    gap, resp = stream_gap_during(server.base_url, lambda: _post_raw(server, "/completions", data))
    assert resp.status_code == 400 and "max_json_values" in resp.json()["error"]["message"]
    assert gap < MAX_GAP_S


def test_a_large_unknown_field_is_refused_naming_it(server: RunningServer) -> None:
    data = b'{"prompt": "x", "ignored": [%s]}' % b",".join([b"[]"] * 20_000)
    resp = _post_raw(server, "/completions", data)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "ignored"
