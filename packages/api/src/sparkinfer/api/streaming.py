"""Server-sent events: `data:` framing, `[DONE]`, error events and `: keep-alive` comments."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from sparkinfer.api.errors import map_exception

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event holding `payload` as compact JSON."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def sse_error(exc: BaseException, request_id: str | None = None) -> bytes:
    """The error event that ends a failed stream: `event: error` plus the OpenAI error body."""
    mapped = map_exception(exc, request_id)
    text = json.dumps(mapped.body, ensure_ascii=False, separators=(",", ":"))
    return b"event: error\ndata: " + text.encode() + b"\n\n"


async def with_keep_alive(events: AsyncIterator[bytes], interval_s: float) -> AsyncIterator[bytes]:
    """Pass `events` through, sending `: keep-alive` whenever none came for `interval_s` seconds.

    A long prefill produces no tokens for a while; the comment keeps proxies from closing the
    connection and is ignored by SSE clients.
    """
    it = aiter(events)
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEP_ALIVE
                continue
            task, pending = pending, None
            try:
                event = task.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


async def sse_stream(
    chunks: AsyncGenerator[bytes, None],
    request_id: str,
    *,
    final: Callable[[], bytes] | None = None,
) -> AsyncGenerator[bytes, None]:
    """`chunks`, then `final()` (e.g. the usage chunk), then `[DONE]`, which ends every stream.

    A failure in `chunks` becomes an `error` event before `[DONE]`; `chunks` is closed in any
    case (a client that went away cancels this generator).
    """
    try:
        async for chunk in chunks:
            yield chunk
        if final is not None:
            yield final()
        yield DONE
    except Exception as exc:
        yield sse_error(exc, request_id)
        yield DONE
    finally:
        await chunks.aclose()


def sse_response(
    chunks: AsyncGenerator[bytes, None],
    request_id: str,
    *,
    keep_alive_s: float,
    final: Callable[[], bytes] | None = None,
) -> StreamingResponse:
    """A `text/event-stream` response of `sse_stream(chunks, ...)` with keep-alive comments."""
    events = sse_stream(chunks, request_id, final=final)
    return StreamingResponse(
        with_keep_alive(events, keep_alive_s), media_type="text/event-stream", headers=SSE_HEADERS
    )
