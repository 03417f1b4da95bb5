"""A route's body from the edge's one parse, validated off the event loop, cheap caps first.

The edge parsed the JSON once (in a worker thread) and counted the values under each top-level
key. Before the body model validates it, in a worker thread too, two caps that cost nothing are
checked: `logit_bias` has at most `max_logit_bias` entries, and a field the route does not know
(ignored, as OpenAI's API does) holds at most MAX_UNKNOWN_FIELD_VALUES values. So a huge
`logit_bias` or a megabyte of ignored arrays is a 400 in microseconds, not after a full
validation that holds Python's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sparkinfer.api.edge import BODY_STATE
from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.json_body import ParsedBody

M = TypeVar("M", bound=BaseModel)
MAX_UNKNOWN_FIELD_VALUES = 10_000  # JSON values in one field the route ignores


def parsed_body(request: Request) -> ParsedBody:
    """The edge's parse of the request's body; 400 when there is none (empty or not JSON)."""
    parsed = request.scope.get("state", {}).get(BODY_STATE)
    if not isinstance(parsed, ParsedBody):
        raise InvalidRequest(
            "the request body is empty or not JSON: send a JSON object with "
            "Content-Type: application/json"
        )
    return parsed


def _known_fields(model: type[BaseModel]) -> frozenset[str]:
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias is not None}
    return frozenset(names)


def check_cheap_caps(parsed: ParsedBody, model: type[BaseModel], *, max_logit_bias: int) -> None:
    """The caps read from the edge's counts, before the model validates anything."""
    known = _known_fields(model)
    for name, num_values in parsed.field_sizes.items():
        if name not in known and num_values > MAX_UNKNOWN_FIELD_VALUES:
            raise InvalidRequest(
                f"{name[:64]} is not a field of this route and holds {num_values} JSON values; "
                f"unknown fields may hold at most {MAX_UNKNOWN_FIELD_VALUES}: remove it",
                param=name[:64],
            )
    raw: Any = parsed.value
    value = cast("dict[str, Any]", raw) if isinstance(raw, dict) else {}
    bias = value.get("logit_bias")
    num_entries = len(cast("dict[str, Any]", bias)) if isinstance(bias, dict) else 0
    if "logit_bias" in known and num_entries > max_logit_bias:
        raise InvalidRequest(
            f"logit_bias has {num_entries} entries; at most {max_logit_bias} are allowed: "
            "bias fewer tokens",
            param="logit_bias",
        )


class JsonBody(Generic[M]):
    """A dependency giving a route its body as `model`: the edge's parse, the cheap caps, then
    validation, all in a worker thread (FastAPI runs a plain callable there). Errors are 400s
    naming the field, as FastAPI's own body validation, or `validate`'s (the other protocols
    name fields as their clients wrote them). /openapi.json documents `model` as the body."""

    def __init__(
        self, model: type[M], *, validate: Callable[[type[M], Any], M] | None = None
    ) -> None:
        self.model = model
        self.validate = validate

    def __call__(self, request: Request) -> M:
        parsed = parsed_body(request)
        limits = request.app.state.server.config.requests
        check_cheap_caps(parsed, self.model, max_logit_bias=limits.max_logit_bias)
        if self.validate is not None:
            return self.validate(self.model, parsed.value)
        try:
            return self.model.model_validate(parsed.value)
        except ValidationError as exc:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
            raise RequestValidationError(errors) from None
