"""Tokenizing a prompt runs off the event loop: while one request's (long) prompt is being
encoded, the server keeps answering everyone else."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

ROUTES = {
    "/completions": ("encode", {"prompt": "Once upon a time", "max_tokens": 2}),
    "/chat/completions": (
        "encode_chat",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2},
    ),
    "/tokenize": ("encode", {"prompt": "Once upon a time"}),
    "/score": ("encode", {"prompt": "Once upon a", "completion": " time"}),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_prompt_being_tokenized_does_not_hold_up_other_requests(
    server, monkeypatch, route
) -> None:
    """The route's tokenizer call blocks until the test has had an answer from /health: were it
    on the event loop, /health could not answer and would time out."""
    method, body = ROUTES[route]
    tokenizer = server.app.state.server.tokenizer
    original = getattr(tokenizer, method)
    entered, release = threading.Event(), threading.Event()

    def blocking(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(tokenizer, method, blocking)
    _check_health_answers_meanwhile(server, route, body, entered, release)


def _check_health_answers_meanwhile(
    server, route: str, body: dict[str, Any], entered: threading.Event, release: threading.Event
) -> None:
    """Post `body` to `route`; once the blocked call has `entered`, /health must answer; then
    `release` it and the route must answer 200."""
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            httpx.post, server.v1 + route, json={"model": model, **body}, timeout=60
        )
        try:
            assert entered.wait(30), f"{route} never reached the blocked call"
            health = httpx.get(server.base_url + "/health", timeout=5)
        finally:
            release.set()
        assert health.status_code == 200
        assert pending.result().status_code == 200


@pytest.mark.parametrize("route", ["/completions", "/chat/completions", "/score"])
def test_a_long_prompt_being_queued_does_not_hold_up_other_requests(
    server, monkeypatch, route
) -> None:
    """Queueing a long prompt (the engine checks it and hashes its blocks) runs on a worker
    thread: with every prompt counted as long, the engine's add_request blocks until /health
    has answered."""
    from sparkinfer.api import engine_client

    monkeypatch.setattr(engine_client, "INLINE_SUBMIT_TOKENS", 0)
    engine = server.app.state.server.engine.engine
    original = engine.add_request
    entered, release = threading.Event(), threading.Event()

    def blocking(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "add_request", blocking)
    _check_health_answers_meanwhile(server, route, ROUTES[route][1], entered, release)
