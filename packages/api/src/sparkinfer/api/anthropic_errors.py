"""Anthropic's error shape on `/v1/messages*`: `{"type": "error", "error": {"type", "message"}}`.

`errors.py` stays the one exception → error mapping; on the Anthropic routes its OpenAI body is
rewritten here, by a middleware outside every other, so errors from the edge (401, 413, bad
JSON), from body validation and from the route all come in Anthropic's shape. A full queue is
Anthropic's 529 `overloaded_error`.
"""

from __future__ import annotations

import json
from typing import Any, cast

from sparkinfer.api.errors import map_exception
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROUTE_PREFIX = "/v1/messages"
OVERLOADED_STATUS = 529
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def anthropic_error(status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An OpenAI error body (and its status) as Anthropic's."""
    error = cast("dict[str, Any]", body.get("error") or {})
    if error.get("code") == "overloaded":
        status = OVERLOADED_STATUS
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = str(error.get("message", "request failed"))
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_sse_error(exc: BaseException, request_id: str | None) -> bytes:
    """The `error` event that ends a failed Anthropic stream."""
    mapped = map_exception(exc, request_id)
    _, body = anthropic_error(mapped.status, mapped.body)
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return b"event: error\ndata: " + text.encode() + b"\n\n"


class AnthropicErrorMiddleware:
    """Pure ASGI: rewrites JSON error responses of the Anthropic routes; all else passes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith(ROUTE_PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewriting_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None:
                await send(message)
                return
            chunks.append(cast("bytes", message.get("body", b"")))
            if not message.get("more_body", False):
                await _send_rewritten(send, start, b"".join(chunks))

        await self.app(scope, receive, rewriting_send)


async def _send_rewritten(send: Send, start: Message, body: bytes) -> None:
    status = int(start["status"])
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "error" in parsed:
        status, new = anthropic_error(status, cast("dict[str, Any]", parsed))
        body = json.dumps(new, ensure_ascii=False).encode()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
