"""SSE framing and keep-alive comments while no event comes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sparkinfer.api.errors import Overloaded
from sparkinfer.api.streaming import KEEP_ALIVE, sse_data, sse_error, with_keep_alive


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
