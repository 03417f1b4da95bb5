"""The one mapping from exceptions to OpenAI-style error bodies (docs/style.md error table)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sparkinfer.model.chat_template import ChatTemplateError
from sparkinfer.model.tokenizer import TokenizerError
from sparkinfer.multimodal import MediaError
from sparkinfer.scheduler import errors as engine_errors
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("sparkinfer.api")
_TRACEBACK_FRAMES = 24  # innermost frames logged with a bug's error


class ApiError(Exception):
    """An error reported to the client: status, OpenAI type and code, and the field at fault."""

    status: int = 400
    type: str = "invalid_request_error"
    code: str = "invalid_value"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(ApiError):
    """A field has a bad value or the body is malformed."""


class ContextLengthError(ApiError):
    """The prompt (plus the requested tokens) does not fit in the context window."""

    code = "context_length_exceeded"


class InvalidToolSchema(ApiError):
    """A tool's JSON Schema is not a valid schema, or uses a `$ref` the server will not follow."""

    code = "invalid_tool_schema"


class InvalidMedia(ApiError):
    """An image or video is unsupported, too large or undecodable."""

    code = "invalid_media"


class ModelNotFound(ApiError):
    status = 404
    type = "not_found_error"
    code = "model_not_found"


class RouteNotFound(ApiError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class RequestTimeout(ApiError):
    status = 408
    code = "request_timeout"


class DeadlineExceeded(ApiError):
    """The request ran longer than request_timeout_s."""

    status = 504
    type = "server_error"
    code = "request_timeout"


class Overloaded(ApiError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class EngineUnavailable(ApiError):
    """The engine has stopped (shut down or its loop died): nothing can be served."""

    status = 503
    type = "server_error"
    code = "engine_unavailable"


class InternalError(ApiError):
    """A bug: the client sees a generic message and the details go to the log."""

    status = 500
    type = "server_error"
    code = "internal_error"


@dataclass(frozen=True)
class ErrorBody:
    """One mapped error: HTTP status, the OpenAI body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict[str, str])


def _param_of(loc: Sequence[int | str]) -> str:
    """`("body", "tools", 2, "function")` → `tools[2].function`."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "json-", "literal[")) or part in {"str", "list[int]"}:
            continue  # pydantic's union-branch tags, not field names
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    """The first pydantic error as a 400 naming the field (never the raw exception text)."""
    errors = exc.errors()
    if not errors:
        return InvalidRequest("the request body is invalid")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "invalid JSON")
        return InvalidRequest(f"the request body is not valid JSON ({detail}): send a JSON object")
    param = _param_of(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    kind = first.get("type")
    if kind == "missing":
        if not param:
            return InvalidRequest("the request body is empty: send a JSON object")
        return InvalidRequest(f"{param} is required", param=param)
    if kind == "extra_forbidden":
        return InvalidRequest(f"{param} is not a known field: remove it", param=param or None)
    if not param and kind == "value_error":  # a check across fields names them itself
        return InvalidRequest(msg)
    param_name = param or "the request body"
    value = first.get("input")
    shown = (
        repr(value) if not isinstance(value, dict | list) else type(cast(object, value)).__name__
    )
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidRequest(f"{param_name}: {msg} (got {shown})", param=param or None)


def to_api_error(exc: BaseException) -> ApiError:
    """Map any exception to an `ApiError`; unknown types are bugs (500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestValidationError):
        return validation_error(exc)
    mapped = _map_library_error(exc)
    if mapped is not None:
        return mapped
    return InternalError("internal server error; the request id is in the server log")


def _map_library_error(exc: BaseException) -> ApiError | None:
    if isinstance(exc, engine_errors.ContextLengthExceeded):
        return ContextLengthError(str(exc))
    if isinstance(exc, engine_errors.QueueFull):
        return Overloaded(str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, engine_errors.EngineStopped):
        return EngineUnavailable(f"{exc}; the server cannot generate: restart it")
    if isinstance(exc, engine_errors.InvalidRequest | TokenizerError):
        return InvalidRequest(str(exc))
    if isinstance(exc, ChatTemplateError):
        return InvalidRequest(str(exc), param="messages")
    if isinstance(exc, MediaError):  # the media module maps with the part's field first
        return InvalidMedia(str(exc))
    return None


def _short_traceback(exc: BaseException) -> str:
    """The innermost frames only: a deep recursion's full traceback runs to megabytes."""
    lines = traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES, chain=False)
    return "".join(lines).rstrip()


def error_body(err: ApiError) -> dict[str, Any]:
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


def map_exception(exc: BaseException, request_id: str | None = None) -> ErrorBody:
    """The HTTP status, body and headers for `exc`; logs bugs with the request id."""
    err = to_api_error(exc)
    if isinstance(err, InternalError):  # a bug: the traceback, if any, goes to the log
        trace = "" if err is exc else "\n" + _short_traceback(exc)
        logger.error("request %s failed: %s%s", request_id or "-", err.message, trace)
    return ErrorBody(err.status, error_body(err), err.headers())


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    rid = _request_id(request)
    mapped = map_exception(exc, rid)
    # A 500 is sent from outside the request-id middleware, so the id is added here too.
    headers = mapped.headers if rid is None else {**mapped.headers, "X-Request-Id": rid}
    return JSONResponse(mapped.body, status_code=mapped.status, headers=headers)


async def _handle_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        err: ApiError = RouteNotFound(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = InvalidRequest(f"method {request.method} is not allowed on {request.url.path}")
        err.status = 405
    elif exc.detail == "There was an error parsing the body":
        err = InvalidRequest(
            "the request body could not be read as JSON: send a JSON object with the header "
            "'Content-Type: application/json'"
        )
    else:
        err = InvalidRequest(str(exc.detail))
        err.status = exc.status_code
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers())


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception through `map_exception` (replaces FastAPI's 422 with a 400)."""
    # Known types are answered by the exception middleware (no traceback in the log);
    # anything else reaches the catch-all, which logs it as a bug.
    expected = (
        RequestValidationError, ApiError, ChatTemplateError, TokenizerError, MediaError,
        engine_errors.ContextLengthExceeded, engine_errors.QueueFull, engine_errors.InvalidRequest,
        engine_errors.EngineStopped,
    )  # fmt: skip
    for exc_type in expected:
        app.add_exception_handler(exc_type, _handle)
    app.add_exception_handler(StarletteHTTPException, _handle_http)
    app.add_exception_handler(Exception, _handle)
