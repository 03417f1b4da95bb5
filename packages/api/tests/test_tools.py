"""Tool schemas at the edge: metaschema, annotations, local $ref (recursive too), no remote $ref."""

from typing import Any

import pytest
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.errors import InvalidRequest, InvalidToolSchema
from sparkinfer.api.schemas.chat import ChatCompletionRequest
from sparkinfer.api.tools import check_tools


def _req(parameters: Any, **extra: Any) -> Conversation:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], **extra}
    )
    return Conversation.of(req)


OBJ = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    "schema",
    [
        OBJ,
        {**OBJ, "$schema": "https://json-schema.org/draft/2020-12/schema", "$comment": "x"},
        {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": OBJ}},
        {
            "type": "object",
            "properties": {"p": {"$ref": "#/definitions/P"}},
            "definitions": {"P": OBJ},
        },
        {
            "$ref": "#/$defs/node",
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                }
            },
        },
    ],
    ids=["plain", "annotations", "defs", "definitions", "recursive"],
)
def test_valid_schemas_are_accepted(schema: dict[str, Any]) -> None:
    tools = check_tools(_req(schema))
    assert tools is not None and tools.names == ["f"]


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "objekt"}, "not a valid JSON Schema"),
        ({"type": "object", "required": "city"}, "not a valid JSON Schema"),
        ({**OBJ, "$schema": 7}, "$schema must be a string"),
        ({**OBJ, "$comment": {"a": 1}}, "$comment must be a string"),
        ({"properties": {"p": {"$ref": "https://example.com/s.json"}}}, "never fetches"),
        ({"properties": {"p": {"$ref": "file:///etc/passwd"}}}, "never fetches"),
        ({"properties": {"p": {"$ref": "#/$defs/missing"}}}, "does not resolve"),
    ],
    ids=["bad-type", "bad-required", "schema-int", "comment-obj", "remote", "file", "dangling"],
)
def test_invalid_schemas_are_refused_naming_the_tool(schema: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidToolSchema) as info:
        check_tools(_req(schema))
    assert info.value.param == "tools[0].function.parameters"
    assert needle in info.value.message


def test_named_tool_choice_must_name_a_tool() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_tools(_req(OBJ, tool_choice={"type": "function", "function": {"name": "g"}}))
    assert info.value.param == "tool_choice.function.name"


def test_arguments_are_checked_against_the_schema() -> None:
    tools = check_tools(_req(OBJ))
    assert tools is not None
    assert tools.check_arguments("f", '{"city": "Paris"}') is None
    assert "city" in (tools.check_arguments("f", "{}") or "")
    assert "not JSON" in (tools.check_arguments("f", "Paris") or "")
