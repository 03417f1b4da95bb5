"""JSON request bodies: parsed with their nesting depth and text checked, so that templates,
schema walks and dumps that recurse never meet a body deeper than MAX_JSON_DEPTH, and no string
that UTF-8 cannot encode reaches the tokenizer or a grammar."""

from __future__ import annotations

import json
import re
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


def check_json_value(value: Any, prefix: tuple[str | int, ...] = ()) -> None:
    """Raise `JsonLimitError` naming the place where `value` nests deeper than MAX_JSON_DEPTH
    or holds a lone surrogate (a string that cannot be encoded as UTF-8)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, prefix)]
    while stack:
        node, path = stack.pop()
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
            stack.append((key, path))  # keys are text too
            stack.append((v, (*path, key)))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json_body(body: bytes) -> Any:
    """The body as JSON, checked; `InvalidRequest` naming the place that fails."""
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
        check_json_value(value)
    except JsonLimitError as exc:
        raise InvalidRequest(str(exc), param=exc.param or None) from None
    return value
