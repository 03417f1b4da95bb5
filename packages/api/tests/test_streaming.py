"""SSE framing, keep-alive comments, and the error event that ends a failed stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import torch
from sparkinfer.api.errors import Overloaded
from sparkinfer.api.streaming import (
    DONE,
    KEEP_ALIVE,
    sse_data,
    sse_error,
    sse_stream,
    with_keep_alive,
)

from .conftest import RunningServer


def test_keep_alive_comments_while_waiting() -> None:
    async def slow() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.35)
        yield b"data: 1\n\n"

    async def collect() -> list[bytes]:
        return [e async for e in with_keep_alive(slow(), 0.1)]

    events = asyncio.run(collect())
    assert events[-1] == b"data: 1\n\n"
    assert events.count(KEEP_ALIVE) >= 2


def test_data_and_error_framing() -> None:
    assert sse_data({"a": 1}) == b'data: {"a":1}\n\n'
    err = sse_error(Overloaded("queue full", retry_after_s=2))
    assert err.startswith(b"event: error\ndata: {") and b'"code":"overloaded"' in err


class FailOnToken(torch.nn.Module):
    """Wraps the served model: a forward whose input holds `token_id` raises."""

    def __init__(self, inner: torch.nn.Module, token_id: int) -> None:
        super().__init__()
        self.inner = inner
        self.token_id = token_id

    def forward(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if bool((input_ids == self.token_id).any()):
            raise RuntimeError("injected failure")
        return self.inner(input_ids, *args, **kwargs)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner.compute_logits(hidden)


def test_engine_failure_ends_the_stream_with_an_error_event(server: RunningServer) -> None:
    runner = server.app.state.server.engine.engine.runner  # type: ignore[attr-defined]
    model = httpx.get(server.v1 + "/models").json()["data"][0]["id"]
    poison = 4242
    runner.model = FailOnToken(runner.model, poison)
    try:
        body = {"model": model, "prompt": [11, poison, 12], "max_tokens": 4, "stream": True}
        resp = httpx.post(server.v1 + "/completions", json=body, timeout=60)
    finally:
        runner.model = runner.model.inner
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e and not e.startswith(":")]
    assert events[-1] == "data: [DONE]"
    kind, data = events[-2].split("\n")
    assert kind == "event: error"
    err = json.loads(data.removeprefix("data: "))["error"]
    assert (err["type"], err["code"]) == ("server_error", "internal_error")
    assert "injected" not in err["message"]  # the cause goes to the log only
    ok = httpx.post(server.v1 + "/completions", json={**body, "prompt": [11, 12]}, timeout=60)
    assert ok.text.endswith("data: [DONE]\n\n") and "event: error" not in ok.text


def test_sse_stream_ends_with_done_and_closes_its_chunks() -> None:
    closed: list[str] = []

    async def chunks(fail: bool) -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
            if fail:
                raise KeyError("secret")
            yield b"data: 2\n\n"
        finally:
            closed.append("fail" if fail else "ok")

    async def collect(fail: bool) -> list[bytes]:
        stream = sse_stream(chunks(fail), "req-1", final=lambda: b"data: usage\n\n")
        return [e async for e in stream]

    assert asyncio.run(collect(False)) == [b"data: 1\n\n", b"data: 2\n\n", b"data: usage\n\n", DONE]
    failed = asyncio.run(collect(True))
    assert failed[0] == b"data: 1\n\n" and failed[-1] == DONE
    assert failed[1].startswith(b"event: error\n") and b"secret" not in failed[1]
    assert closed == ["ok", "fail"]
