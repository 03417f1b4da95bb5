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
