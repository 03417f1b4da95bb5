"""Tools at the edge: JSON Schema checks (metaschema, local `$ref` only), tool_choice, arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import jsonschema
import jsonschema.exceptions
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.validators import Draft202012Validator
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.errors import InvalidRequest, InvalidToolSchema
from sparkinfer.api.schemas.chat import NamedToolChoice, Tool

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_ANNOTATION_KEYS = ("$schema", "$comment")
_MAX_SCHEMA_DEPTH = 64
DEFAULT_MAX_SCHEMA_NODES = 4000  # the max_schema_nodes setting's default
DEFAULT_MAX_SCHEMA_BYTES = 262144  # the max_schema_bytes setting's default
MAX_ENUM_VALUES = 1000  # enum values in all of a request's schemas (OpenAI's limit)


def _walk(node: Any, path: str, depth: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object inside a schema with its JSON-pointer-like path."""
    if depth > _MAX_SCHEMA_DEPTH:
        raise ValueError(f"{path or '/'} is nested deeper than {_MAX_SCHEMA_DEPTH} levels")
    if isinstance(node, dict):
        obj = cast("dict[str, Any]", node)
        yield path, obj
        for key, value in obj.items():
            yield from _walk(value, f"{path}/{key}", depth + 1)
    elif isinstance(node, list):
        for i, value in enumerate(cast("list[Any]", node)):
            yield from _walk(value, f"{path}/{i}", depth + 1)


@dataclass(frozen=True)
class SchemaSize:
    """What a grammar's compile time grows with: JSON values, bytes and enum values."""

    num_values: int = 0
    num_bytes: int = 0
    num_enum_values: int = 0

    def __add__(self, other: SchemaSize) -> SchemaSize:
        return SchemaSize(
            self.num_values + other.num_values,
            self.num_bytes + other.num_bytes,
            self.num_enum_values + other.num_enum_values,
        )


@dataclass(frozen=True)
class SchemaLimits:
    max_values: int = DEFAULT_MAX_SCHEMA_NODES
    max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES


def schema_size(schema: Any) -> SchemaSize:
    """The JSON values in a schema (objects, arrays and scalars alike), its bytes as JSON and
    its enum values."""
    num_values, num_enum, stack = 0, 0, [schema]
    while stack:
        node = stack.pop()
        num_values += 1
        if isinstance(node, dict):
            obj = cast("dict[str, Any]", node)
            enum = obj.get("enum")
            num_enum += len(cast("list[Any]", enum)) if isinstance(enum, list) else 0
            stack.extend(obj.values())
        elif isinstance(node, list):
            stack.extend(cast("list[Any]", node))
    return SchemaSize(num_values, len(json.dumps(schema)), num_enum)


def _check_size(
    size: SchemaSize,
    limits: SchemaLimits,
    param: str,
    error: type[InvalidRequest | InvalidToolSchema],
) -> None:
    fix = "send fewer properties, enum values or tools"
    if size.num_values > limits.max_values:
        raise error(
            f"{param} has {size.num_values} JSON values in its schemas; at most "
            f"{limits.max_values} are enforced as a grammar (max_schema_nodes): {fix}",
            param=param,
        )
    if size.num_bytes > limits.max_bytes:
        raise error(
            f"{param} has {size.num_bytes} bytes of schemas; at most {limits.max_bytes} are "
            f"enforced as a grammar (max_schema_bytes): {fix}",
            param=param,
        )
    if size.num_enum_values > MAX_ENUM_VALUES:
        raise error(
            f"{param} has {size.num_enum_values} enum values in its schemas; at most "
            f"{MAX_ENUM_VALUES} are enforced as a grammar: {fix}",
            param=param,
        )


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)


def _registry(schema: dict[str, Any]) -> referencing.Registry[Any]:
    """A registry holding only `schema` itself; any other URI is refused, never fetched."""
    resource = referencing.jsonschema.DRAFT202012.create_resource(schema)
    return referencing.Registry(retrieve=_refuse_retrieval).with_resource("", resource)


def check_schema(
    schema: Any, param: str, *, error: type[InvalidRequest | InvalidToolSchema]
) -> None:
    """Check `schema` against the 2020-12 metaschema and its `$ref`s; raise `error` naming `param`.

    `$schema`/`$comment` are annotations (must be strings). `$ref` must be local (`#...`, into
    `$defs`/`definitions`) and must resolve; recursion is fine. Remote or file refs are refused
    because the server never fetches schemas.
    """
    if not isinstance(schema, dict | bool):
        raise error(
            f"{param} must be a JSON Schema object, got {type(schema).__name__}", param=param
        )
    if isinstance(schema, bool):
        return
    schema = cast("dict[str, Any]", schema)
    try:
        nodes = list(_walk(schema, ""))
    except ValueError as exc:
        raise error(f"{param}: {exc}: flatten the schema", param=param) from None
    for path, node in nodes:
        for key in _ANNOTATION_KEYS:
            if key in node and not isinstance(node[key], str):
                raise error(
                    f"{param}{path}/{key} must be a string, got {type(node[key]).__name__}",
                    param=param,
                )
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise error(
            f"{param} is not a valid JSON Schema: at '/{where}': {exc.message}", param=param
        ) from None
    registry = _registry(schema)
    resolver = registry.resolver(base_uri="")
    for path, node in nodes:
        for key in _REF_KEYS:
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            if not ref.startswith("#"):
                raise error(
                    f"{param}{path}/{key} is {ref!r}, a remote or file reference; the server "
                    "never fetches schemas: inline it under $defs and refer to it as "
                    "'#/$defs/NAME'",
                    param=param,
                )
            try:
                resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                raise error(
                    f"{param}{path}/{key} is {ref!r}, which does not resolve inside the schema: "
                    "define it under $defs",
                    param=param,
                ) from None


@dataclass(frozen=True)
class ToolSet:
    """The request's tools by name, with a validator for each one's arguments."""

    tools: tuple[Tool, ...]
    validators: dict[str, Draft202012Validator]

    @property
    def names(self) -> list[str]:
        return [t.function.name for t in self.tools]

    def parameters(self, name: str) -> dict[str, Any] | None:
        for tool in self.tools:
            if tool.function.name == name:
                return tool.function.parameters
        return None

    def check_arguments(self, name: str, arguments: str) -> str | None:
        """Why `arguments` (JSON text) is not a valid call of `name`; None when it is."""
        validator = self.validators.get(name)
        if validator is None:
            return f"no tool named {name!r}"
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return f"arguments are not JSON: {exc}"
        if not isinstance(value, dict):
            return "arguments are not a JSON object"
        # jsonschema's stubs leave iter_errors' legacy overload and best_match's return untyped.
        errors = validator.iter_errors(cast("dict[str, Any]", value))  # pyright: ignore[reportUnknownMemberType]
        best = jsonschema.exceptions.best_match(errors)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        error = cast("jsonschema.ValidationError | None", best)
        return None if error is None else error.message


def validator_for(schema: dict[str, Any] | bool | None) -> Draft202012Validator:
    """A validator whose `$ref`s resolve inside `schema` only."""
    if schema is None or isinstance(schema, bool):
        return Draft202012Validator({} if schema is None else schema)
    return Draft202012Validator(schema, registry=_registry(schema))


def check_tools(conv: Conversation, *, limits: SchemaLimits = SchemaLimits()) -> ToolSet | None:
    """Validate tools and tool_choice before anything is queued; None when there are no tools.

    The tools' parameter schemas keep `limits` in all."""
    if not conv.tools:
        if conv.tool_choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice needs a non-empty tools list", param="tool_choice")
        return None
    seen: set[str] = set()
    validators: dict[str, Draft202012Validator] = {}
    total = SchemaSize()
    for i, tool in enumerate(conv.tools):
        total += schema_size(tool.function.parameters)
        _check_size(total, limits, f"tools[{i}].function.parameters", InvalidToolSchema)
        name = tool.function.name
        if name in seen:
            raise InvalidRequest(
                f"tools[{i}].function.name {name!r} is used twice: give each tool its own name",
                param=f"tools[{i}].function.name",
            )
        seen.add(name)
        params = tool.function.parameters
        if params is not None:
            check_schema(params, f"tools[{i}].function.parameters", error=InvalidToolSchema)
        validators[name] = validator_for(params)
    choice = conv.tool_choice
    if isinstance(choice, NamedToolChoice) and choice.function.name not in seen:
        raise InvalidRequest(
            f"tool_choice.function.name {choice.function.name!r} is not among tools "
            f"({', '.join(sorted(seen))}): name one of them",
            param="tool_choice.function.name",
        )
    return ToolSet(conv.tools, validators)


def check_response_format_schema(
    conv: Conversation, *, limits: SchemaLimits = SchemaLimits()
) -> dict[str, Any] | None:
    """The json_schema response format's schema, validated; None for text/json_object."""
    fmt = conv.response_format
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return None
    schema = fmt.json_schema.schema_
    if schema is None:
        raise InvalidRequest(
            "response_format.json_schema.schema is required", param="response_format.json_schema"
        )
    param = "response_format.json_schema.schema"
    _check_size(schema_size(schema), limits, param, InvalidRequest)
    check_schema(schema, param, error=InvalidRequest)
    return schema


def check_response_format_stops(conv: Conversation) -> None:
    """Refuse stop strings and stop ids with JSON output: they could cut it into invalid JSON."""
    fmt = conv.response_format
    if fmt is None or fmt.type == "text":
        return
    sampling = conv.sampling
    stops = (("stop", sampling.stop_strings), ("stop_token_ids", sampling.stop_token_ids))
    for param, value in stops:
        if value:
            raise InvalidRequest(
                f"{param} is set with response_format {fmt.type}: a stop could cut the JSON "
                f"short and leave it invalid; leave {param} out (the JSON ends the answer itself)",
                param=param,
            )
