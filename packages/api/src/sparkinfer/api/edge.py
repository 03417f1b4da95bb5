"""The edge of every HTTP request, before a route runs: API key, body size and read time, the JSON
body parsed and checked off the event loop, and unexpected errors answered without dropping the
connection.

A request that runs past `request_timeout_s` is cancelled (its engine requests aborted) and ends
with a 504, or with an `event: error` when its stream is under way.

Order, cheapest refusal first: the API key from the headers (401 before a byte of the body is
read), then `Content-Length` against the cap (413), then the body read within its deadline (408)
and its running size (413, for chunked bodies), then the JSON (when its commas and brackets
allow at most `max_json_values` values) parsed once in a worker thread and checked for nesting
depth, lone surrogates and NaN/Infinity (400 naming the field). The route gets the parsed body
(`request_body.JsonBody`) and the same bytes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sparkinfer.api.anthropic_errors import ROUTE_PREFIX as ANTHROPIC_ROUTES
from sparkinfer.api.anthropic_errors import anthropic_sse_error
from sparkinfer.api.errors import (
    ApiError,
    DeadlineExceeded,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    error_body,
    map_exception,
)
from sparkinfer.api.json_body import parse_json_body
from sparkinfer.api.streaming import DONE, sse_error
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("sparkinfer.api")
_BODY_METHODS = ("POST", "PUT", "PATCH")
OWNER_STATE = "api_key_name"  # the scope state key of the request's API key name
BODY_STATE = "json_body"  # the scope state key of the request's parsed body (`ParsedBody`)


@dataclass(frozen=True)
class EdgeConfig:
    """What the edge enforces (built by `settings.edge_config`)."""

    api_keys: dict[str, str]  # name → key; empty: no auth
    is_guarded: Callable[[str], bool]  # whether a path needs a key
    max_body_bytes: int
    body_timeout_s: float
    request_timeout_s: float | None = None  # None: no deadline
    max_json_values: int | None = None  # None: no cap


def key_name(headers: Headers, keys: dict[str, str]) -> str | None:
    """The name of the key sent as `Authorization: Bearer <key>` or `x-api-key: <key>` (every
    key compared, each in constant time); None when it is none of them."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    sent = [token.strip()] if scheme.lower() == "bearer" else []
    if (other := headers.get("x-api-key")) is not None:
        sent.append(other.strip())
    found = None
    for name, key in keys.items():
        for value in sent:
            if hmac.compare_digest(value.encode(), key.encode()):
                found = name
    return found


def client_id(scope: Scope) -> str:
    """Who sent a request, for fair shares: its API key's name, else its address."""
    owner = key_owner(scope)
    if owner:
        return "key:" + owner
    peer = scope.get("client")
    return "address:" + (str(peer[0]) if peer else "")


def key_owner(scope: Scope) -> str:
    """Who a request is, for what it stores: its API key's name ("" on a server without keys)."""
    return cast("str", cast("dict[str, Any]", scope.get("state", {})).get(OWNER_STATE, ""))


class _Progress:
    """How far the response of one request has gone."""

    def __init__(self) -> None:
        self.is_started = False
        self.is_event_stream = False
        self.is_done = False

    def see(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.is_started = True
            headers = Headers(raw=cast("list[tuple[bytes, bytes]]", message.get("headers", [])))
            self.is_event_stream = headers.get("content-type", "").startswith("text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.is_done = True


class EdgeMiddleware:
    """Pure ASGI middleware: the checks above, then the app; streams pass through untouched."""

    def __init__(self, app: ASGIApp, *, config: EdgeConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = _Progress()

        async def tracked_send(message: Message) -> None:
            progress.see(message)
            await send(message)

        rid = cast("dict[str, Any]", scope.get("state", {})).get("request_id")
        deadline = asyncio.timeout(self.config.request_timeout_s)
        try:
            async with deadline:
                await self._serve(scope, receive, tracked_send)
        except TimeoutError:
            if not deadline.expired():
                raise
            await self._end_late(
                send, progress, rid, is_anthropic=scope["path"].startswith(ANTHROPIC_ROUTES)
            )
        except Exception as exc:
            if progress.is_started:
                raise
            # Answered here rather than by Starlette's outermost handler, which re-raises into
            # the server: that would drop the kept-alive connection and log the error twice.
            mapped = map_exception(exc, rid)
            await _send_json(send, mapped.status, mapped.body, mapped.headers)

    async def _end_late(
        self, send: Send, progress: _Progress, rid: str | None, *, is_anthropic: bool
    ) -> None:
        """The request ran past request_timeout_s (its work is cancelled, so the engine request
        is aborted): a 504, or an error event that ends the stream already under way."""
        err = DeadlineExceeded(
            f"the request ran longer than request_timeout_s ({self.config.request_timeout_s:g} "
            "s): ask for fewer tokens"
        )
        logger.info("request %s: %s", rid or "-", err.message)
        if not progress.is_started:
            await _send_error(send, err)
        elif progress.is_event_stream and not progress.is_done:
            # Each protocol ends its stream its own way (Anthropic's has no [DONE]).
            tail = anthropic_sse_error(err, rid) if is_anthropic else sse_error(err, rid) + DONE
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        elif not progress.is_done:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        keys = self.config.api_keys
        name = key_name(headers, keys) if keys else None
        if keys and name is None and self.config.is_guarded(scope["path"]):
            err = Unauthorized(
                "missing or wrong API key: send the header 'Authorization: Bearer <api key>'"
            )
            await _send_error(send, err)
            return
        if name is not None:
            scope.setdefault("state", {})[OWNER_STATE] = name
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read_body(headers, receive)
            if body and _is_json(headers):
                parsed = await run_in_threadpool(
                    parse_json_body, body, max_values=self.config.max_json_values
                )
                scope.setdefault("state", {})[BODY_STATE] = parsed
        except ApiError as err:
            await _send_error(send, err)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, headers: Headers, receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        break
                    chunk = cast("bytes", message.get("body", b""))
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(size, limit)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestTimeout(
                f"the request body did not arrive within {self.config.body_timeout_s:g} s "
                "(body_read_timeout_s): send it at once"
            ) from None
        return b"".join(chunks)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body has {size} bytes or more; max_body_bytes is {limit}: send less "
        "(e.g. smaller or fewer images) or raise max_body_bytes"
    )


def _is_json(headers: Headers) -> bool:
    kind = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the read body once, then the client's own messages (so a
    disconnect is still seen)."""
    is_sent = False

    async def replayed() -> Message:
        nonlocal is_sent
        if not is_sent:
            is_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send_error(send: Send, err: ApiError) -> None:
    await _send_json(send, err.status, error_body(err), err.headers())


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str]
) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
