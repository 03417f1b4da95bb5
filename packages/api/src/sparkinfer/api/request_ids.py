"""Request ids: the client's `X-Request-Id` (sanitised, bounded) or a fresh one.

`RequestIdMiddleware` stores the id in `request.state.request_id` before any route runs and
returns it as `X-Request-Id` on every response. Routes use it as the suffix of the response id
(`chatcmpl-<id>`) and in every log line of the request; error bodies are logged under it.
"""

from __future__ import annotations

import re
import secrets
import uuid

from fastapi import Request
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-Id"
MAX_REQUEST_ID_LEN = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")  # kept out of ids, logs and headers


def sanitise_request_id(raw: str | None) -> str:
    """The client's id without unsafe characters, cut to 64; a fresh one if nothing is left."""
    cleaned = _UNSAFE.sub("", raw or "")[:MAX_REQUEST_ID_LEN]
    return cleaned or uuid.uuid4().hex


def request_id(request: Request) -> str:
    """This request's id (the middleware sets it; made here if the app runs without it)."""
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = request.state.request_id = uuid.uuid4().hex
    return rid


def engine_request_id(response_id: str, index: int) -> str:
    """The engine id of one choice: unique even when a client reuses its X-Request-Id."""
    return f"{response_id}-{index}-{secrets.token_hex(4)}"


class RequestIdMiddleware:
    """Pure ASGI middleware (streams pass through untouched) that sets and returns the id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = sanitise_request_id(Headers(scope=scope).get(HEADER))
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if HEADER not in headers:
                    headers.append(HEADER, rid)
            await send(message)

        await self.app(scope, receive, send_with_id)
