"""Qwen's XML tool calls → OpenAI tool calls, for whole outputs and for streams.

The model writes (docs/model.md §13)::

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values follow the `qwen3_coder` rules: one leading and one trailing newline are stripped, then
the text is converted by the tool's JSON-schema type (strings raw, everything else as JSON with
tolerant fallbacks). A block naming an unknown tool, a malformed block and a block cut off by
the end of the output stay in the content as plain text; parsing never raises. Whitespace
next to a valid call is dropped, except between two pieces of text (kept once, after the call).

Streaming holds back anything that could still become `<tool_call>`, and emits a call once its
`</tool_call>` arrives (a header delta with id and name, then its arguments), so a call that
turns out malformed can still be returned as text. `parse(text)` runs the same state machine
over the whole text, so streaming and whole-text parsing agree at every split.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sparkinfer.api.stops import partial_tag_len

logger = logging.getLogger("sparkinfer.api")
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_PARAM_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
_PARAM_CLOSE = "</parameter>"
_MAX_REF_DEPTH = 32  # recursive $refs stop here (treated as any type)
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.DOTALL)
_TYPE_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "uint": "integer", "long": "integer", "short": "integer",
    "float": "number", "double": "number", "bool": "boolean", "dict": "object", "list": "array",
}  # fmt: skip


def new_call_id() -> str:
    """An OpenAI-style tool call id: "call_" + 24 random hex digits."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call; `arguments` is a JSON object as text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of call `index`: the header (id and name) or a chunk of arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        # Every delta says "function": the openai SDK's stream helper drops a call otherwise.
        if self.id is None:
            return {
                "index": self.index,
                "type": "function",
                "function": {"arguments": self.arguments},
            }
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class ParsedToolCalls:
    content: str
    calls: list[ToolCall]


@dataclass(frozen=True)
class ToolStreamDelta:
    content: str
    calls: list[ToolCallDelta]


class ToolSchemas(Protocol):
    """A request's tools by name (e.g. `sparkinfer.api.tools.ToolSet`)."""

    @property
    def names(self) -> list[str]: ...

    def parameters(self, name: str) -> dict[str, Any] | None: ...


class ToolCallParser:
    """Parses Qwen XML tool calls against a request's OpenAI `tools` list.

    `check_arguments(name, arguments_json)` returns why a parsed call is not valid (None: it is);
    a call it refuses stays in the content as text, like a malformed one, unless
    `is_invalid_dropped`: then a block that opened `<tool_call>` but is no valid call of a declared
    tool (unknown name, malformed, refused) is left out of the content altogether, so
    call markup never comes back as text.
    """

    def __init__(
        self,
        tools: ToolSchemas | Sequence[Mapping[str, Any]] | None,
        *,
        make_call_id: Callable[[], str] = new_call_id,
        check_arguments: Callable[[str, str], str | None] | None = None,
        is_invalid_dropped: bool = False,
    ) -> None:
        self._schemas = _schemas_by_name(tools)
        self._make_call_id = make_call_id
        self._check_arguments = check_arguments
        self.is_invalid_dropped = is_invalid_dropped

    def parse(self, text: str) -> ParsedToolCalls:
        """Split a whole output into content and tool calls."""
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return ParsedToolCalls(first.content + last.content, stream.calls)

    def stream(self) -> StreamingToolCallParser:
        """A parser for one streamed output."""
        return StreamingToolCallParser(self)

    def parse_block(self, body: str) -> ToolCall | None:
        """The call between <tool_call> and </tool_call>; None if unknown, malformed or refused."""
        match = _FUNCTION.match(body)
        if match is None:
            return None
        name = match.group(1).strip()
        schema = self._schemas.get(name)
        if schema is None:
            return None
        arguments = _parse_parameters(match.group(2), schema)
        if arguments is None:
            return None
        text = json.dumps(arguments, ensure_ascii=False)
        if self._check_arguments is not None and self._check_arguments(name, text) is not None:
            return None
        return ToolCall(id=self._make_call_id(), name=name, arguments=text)


class StreamingToolCallParser:
    """Feeds text deltas; yields content deltas and OpenAI-shaped tool-call deltas."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._buffer = ""  # text not yet classified
        self._in_call = False  # the buffer holds the inside of an open <tool_call>
        self._pending_ws: str = ""  # trailing whitespace of content, dropped if a call follows
        self._is_after_call = False  # only whitespace since the last call
        self._has_content = False
        self._is_truncated = False  # the output was cut short: an unclosed call is dropped
        self._calls: list[ToolCall] = []

    @property
    def calls(self) -> list[ToolCall]:
        """The calls completed so far."""
        return list(self._calls)

    def feed(self, delta: str) -> ToolStreamDelta:
        self._buffer += delta
        return self._drain(is_final=False)

    def finish(self, *, is_truncated: bool = False) -> ToolStreamDelta:
        """End of output: flush held-back text; an unclosed call becomes text, or is dropped when
        the output was cut short (`is_truncated`: it is a call's beginning, not prose)."""
        self._is_truncated = is_truncated
        return self._drain(is_final=True)

    def _drain(self, *, is_final: bool) -> ToolStreamDelta:
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            if not self._in_call:
                idx = self._buffer.find(TOOL_CALL_START)
                if idx < 0:
                    keep = 0 if is_final else partial_tag_len(self._buffer, TOOL_CALL_START)
                    content.append(self._text(self._buffer[: len(self._buffer) - keep]))
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    if is_final:
                        content.append("" if self._is_after_call else self._pending_ws)
                        self._pending_ws = ""
                    break
                content.append(self._text(self._buffer[:idx]))
                self._buffer = self._buffer[idx + len(TOOL_CALL_START) :]
                self._in_call = True
                continue
            end = self._buffer.find(TOOL_CALL_END)
            restart = self._buffer.find(TOOL_CALL_START)
            if restart >= 0 and (end < 0 or restart < end):
                # A second <tool_call> before any close: the first one was stray text.
                content.append(self._refused(TOOL_CALL_START + self._buffer[:restart]))
                self._buffer = self._buffer[restart + len(TOOL_CALL_START) :]
                continue
            if end < 0:
                if not is_final:
                    break
                if not self._is_truncated:  # an unclosed call in a finished output is prose
                    content.append(self._text(TOOL_CALL_START + self._buffer))
                self._buffer, self._in_call = "", False
                continue
            body = self._buffer[:end]
            self._buffer = self._buffer[end + len(TOOL_CALL_END) :]
            self._in_call = False
            call = self._parser.parse_block(body)
            if call is None:
                content.append(self._refused(TOOL_CALL_START + body + TOOL_CALL_END))
                continue
            self._pending_ws, self._is_after_call = "", True
            index = len(self._calls)
            self._calls.append(call)
            deltas.append(ToolCallDelta(index, call.id, call.name, ""))
            deltas.append(ToolCallDelta(index, None, None, call.arguments))
        return ToolStreamDelta("".join(content), deltas)

    def _refused(self, markup: str) -> str:
        """A block that is no valid call: text, or nothing when invalid calls are dropped."""
        if self._parser.is_invalid_dropped:
            logger.info("a tool call block that is no valid call was dropped: %.200r", markup)
            self._pending_ws, self._is_after_call = "", True  # its whitespace goes as a call's
            return ""
        return self._text(markup)

    def _text(self, text: str) -> str:
        """Emit content, holding back trailing whitespace that a following call would drop."""
        if self._is_after_call and not self._has_content:
            text = text.lstrip()
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        if body:
            self._is_after_call, self._has_content = False, True
        return body


def parse_tool_calls(
    text: str, tools: ToolSchemas | Sequence[Mapping[str, Any]] | None
) -> ParsedToolCalls:
    """Split a whole output into content and tool calls (ids from `new_call_id`)."""
    return ToolCallParser(tools).parse(text)


def _schemas_by_name(
    tools: ToolSchemas | Sequence[Mapping[str, Any]] | None,
) -> dict[str, Mapping[str, Any]]:
    """Tool name → its parameters schema ({} when a tool declares none)."""
    if tools is None:
        return {}
    if not isinstance(tools, Sequence):
        return {name: tools.parameters(name) or {} for name in tools.names}
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        function = _mapping(tool.get("function", tool))
        if function is not None and isinstance(function.get("name"), str):
            schemas[function["name"]] = _mapping(function.get("parameters")) or {}
    return schemas


def _parse_parameters(body: str, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """`<parameter=K>\\nV\\n</parameter>` pairs → converted values; None if malformed."""
    props = _mapping(schema.get("properties")) or {}
    arguments: dict[str, Any] = {}
    pos = 0
    while body[pos:].strip():
        opening = _PARAM_OPEN.match(body, pos)
        if opening is None:
            return None
        close = _find_param_close(body, opening.end())
        if close < 0:
            return None
        value = body[opening.end() : close]
        value = value.removeprefix("\n").removesuffix("\n")
        name = opening.group(1).strip()
        arguments[name] = convert_value(value, _mapping(props.get(name)), root=schema)
        pos = close + len(_PARAM_CLOSE)
    return arguments


def _find_param_close(body: str, start: int) -> int:
    """The `</parameter>` followed by another parameter or the end, so values may contain it."""
    close = body.find(_PARAM_CLOSE, start)
    while close >= 0:
        rest = body[close + len(_PARAM_CLOSE) :].lstrip()
        if not rest or rest.startswith("<parameter="):
            return close
        close = body.find(_PARAM_CLOSE, close + 1)
    return -1


def schema_types(
    schema: Mapping[str, Any] | None, *, root: Mapping[str, Any] | None = None, depth: int = 0
) -> set[str]:
    """JSON types a schema allows (type lists, anyOf/oneOf, enums, local `$ref`s into `root`);
    an empty set means any type."""
    if schema is None or depth > _MAX_REF_DEPTH:
        return set()
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return schema_types(_resolve_ref(ref, root), root=root, depth=depth + 1)
    found: set[str] = set()
    declared = schema.get("type")
    names = cast("list[Any]", declared) if isinstance(declared, list) else [declared]
    for name in names:
        if isinstance(name, str):
            found.add(_TYPE_ALIASES.get(name.lower(), name.lower()))
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        for branch in _items(branches):
            sub = schema_types(_mapping(branch), root=root, depth=depth + 1)
            if not sub:
                return set()  # one unconstrained branch allows anything
            found |= sub
    enum = _items(schema.get("enum"))
    if not found and enum:
        found = {_json_type(v) for v in enum}
    return found


def _resolve_ref(ref: str, root: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A local JSON pointer (`#/$defs/unit`) inside `root`; None when it does not resolve."""
    if root is None or not ref.startswith("#"):
        return None
    node: Mapping[str, Any] | None = root
    for key in ref[1:].split("/")[1:] if ref != "#" else []:
        key = key.replace("~1", "/").replace("~0", "~")
        node = _mapping(node.get(key)) if node is not None else None
    return node


def _mapping(value: object) -> Mapping[str, Any] | None:
    """A JSON-Schema node as a JSON object, or None when it is not one."""
    return cast("Mapping[str, Any]", value) if isinstance(value, Mapping) else None


def _items(value: object) -> list[Any]:
    """A JSON-Schema node's items when it is a JSON array, else none."""
    return cast("list[Any]", value) if isinstance(value, list) else []


def convert_value(
    value: str, schema: Mapping[str, Any] | None, *, root: Mapping[str, Any] | None = None
) -> Any:
    """Convert a raw parameter text by the schema's type(s); fall back to the raw string.

    `root` is the tool's whole parameters schema, for resolving local `$ref`s.
    """
    types = schema_types(schema, root=root)
    if types == {"string"}:
        return value
    stripped = value.strip()
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    parsed = _loads(stripped)
    if parsed is not _NOTHING and (not types or _fits(parsed, types)):
        return _as_integer(parsed) if "integer" in types and "number" not in types else parsed
    fallback = _fallback(stripped, types)
    if fallback is not _NOTHING:
        return fallback
    if "string" in types or not types:
        return value
    return value if parsed is _NOTHING else parsed


_NOTHING: Any = object()


def _loads(text: str) -> Any:
    """JSON, then a Python literal (models sometimes write {'a': True}); _NOTHING if neither."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOTHING
    if isinstance(value, float) and not math.isfinite(value):
        return _NOTHING
    if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
        return cast(Any, value)  # literal_eval's containers come back untyped
    return _NOTHING


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # NaN/Infinity would not survive json.dumps


def _fits(value: Any, types: set[str]) -> bool:
    return _json_type(value) in types or (
        isinstance(value, float) and value.is_integer() and "integer" in types
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _as_integer(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _fallback(text: str, types: set[str]) -> Any:
    """Tolerant conversions for values JSON rejects: "True", "+5", ".5"."""
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in types:
        try:
            return int(text)
        except ValueError:
            pass
    if "number" in types or "integer" in types:
        try:
            number = float(text)
        except ValueError:
            return _NOTHING
        if math.isfinite(number):
            return int(number) if number.is_integer() and "number" not in types else number
    return _NOTHING
