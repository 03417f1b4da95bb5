"""Admission through HTTP: free seats take a burst at once; what could never fit is a 400."""

from __future__ import annotations

import httpx

from .conftest import serve

USER = [{"role": "user", "content": "hi"}]


def test_idle_seats_take_n_choices_and_never_fitting_ones_are_400() -> None:
    with serve(max_num_seqs=4, max_queue_depth=1) as s:
        body = {"messages": USER, "max_tokens": 1, "n": 4}
        resp = httpx.post(s.v1 + "/chat/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text  # four free seats: nothing waits
        resp = httpx.post(s.v1 + "/chat/completions", json={**body, "n": 6}, timeout=60)
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err["param"] == "n" and "at most 5" in err["message"]
        prompts = {"prompt": ["a"] * 3, "n": 2, "max_tokens": 1}
        resp = httpx.post(s.v1 + "/completions", json=prompts, timeout=60)
        assert resp.status_code == 400 and "6 choices" in resp.json()["error"]["message"]


def test_completions_batch_is_bounded(server) -> None:
    body = {"prompt": ["a"] * 65, "max_tokens": 1}
    resp = httpx.post(server.v1 + "/completions", json=body, timeout=60)
    assert resp.status_code == 400
    assert "65 prompts x n=1 make 65 choices; at most 64" in resp.json()["error"]["message"]
