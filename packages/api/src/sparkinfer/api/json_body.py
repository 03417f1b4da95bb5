"""JSON request bodies: parsed with their nesting depth and text checked, so that templates,
schema walks and dumps that recurse never meet a body deeper than MAX_JSON_DEPTH, and no string
that UTF-8 cannot encode reaches the tokenizer or a grammar."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, cast

from sparkinfer.api.errors import InvalidRequest

MAX_JSON_DEPTH = 64  # deeper bodies are refused: templates, schemas and dumps all recurse
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class JsonLimitError(ValueError):
    """A JSON value nests too deep or holds text that is not valid Unicode (`param`: where)."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


def json_path(parts: tuple[str | int, ...]) -> str:
    """`("tools", 2, "function")` → `tools[2].function`."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _shown_path(parts: tuple[str | int, ...]) -> str:
    return json_path(parts[:4]) + ("..." if len(parts) > 4 else "")


def check_json_value(value: Any, prefix: tuple[str | int, ...] = ()) -> dict[str, int]:
    """Raise `JsonLimitError` naming the place where `value` nests deeper than MAX_JSON_DEPTH
    or holds a lone surrogate (a string that cannot be encoded as UTF-8); else the number of
    JSON values under each key of a top-level object (what the cheap caps read)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, prefix)]
    field_sizes: dict[str, int] = {}
    top = len(prefix)
    while stack:
        node, path = stack.pop()
        if len(path) > top and isinstance(key := path[top], str):
            field_sizes[key] = field_sizes.get(key, 0) + 1
        if isinstance(node, str):
            if (m := _SURROGATE.search(node)) is not None:
                where = json_path(path) or "the body"
                raise JsonLimitError(
                    f"{where} holds a lone surrogate (U+{ord(m.group()):04X}), which is not "
                    "valid Unicode: send text as UTF-8 or as complete \\uXXXX surrogate pairs",
                    param=where,
                )
            continue
        if not isinstance(node, dict | list):
            continue
        if len(path) - len(prefix) >= MAX_JSON_DEPTH:
            raise JsonLimitError(
                f"{_shown_path(path)} is nested deeper than {MAX_JSON_DEPTH} levels: flatten it",
                param=json_path(path[:1]),
            )
        if isinstance(node, list):
            items = cast("list[Any]", node)
            stack.extend((v, (*path, i)) for i, v in enumerate(items))
            continue
        for key, v in cast("dict[str, Any]", node).items():
            if _SURROGATE.search(key) is not None:  # keys are text too
                stack.append((key, path))
            stack.append((v, (*path, key)))
    return field_sizes


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


@dataclass(frozen=True)
class ParsedBody:
    """A request's JSON body, parsed once at the edge, and the JSON values under each of its
    top-level keys."""

    value: Any
    field_sizes: dict[str, int]


def max_json_values_upper_bound(body: bytes) -> int:
    """At least the number of JSON values in `body` (commas and brackets, inside strings too),
    counted in C at memory speed, before anything is parsed."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


def parse_json_body(body: bytes, *, max_values: int | None = None) -> ParsedBody:
    """The body as JSON, checked; `InvalidRequest` naming the place that fails. A body that may
    hold more than `max_values` values is refused before it is parsed."""
    if max_values is not None and (bound := max_json_values_upper_bound(body)) > max_values:
        raise InvalidRequest(
            f"the request body holds up to {bound} JSON values (counting its commas and "
            f"brackets); at most {max_values} are parsed (max_json_values): send less"
        )
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise InvalidRequest(
            f"the request body is nested deeper than {MAX_JSON_DEPTH} levels: flatten it"
        ) from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"the request body is not UTF-8 ({exc.reason} at byte {exc.start}): send UTF-8 JSON"
        ) from None
    except ValueError as exc:
        raise InvalidRequest(
            f"the request body is not valid JSON ({exc}): send a JSON object"
        ) from None
    try:
        field_sizes = check_json_value(value)
    except JsonLimitError as exc:
        raise InvalidRequest(str(exc), param=exc.param or None) from None
    return ParsedBody(value, field_sizes)
