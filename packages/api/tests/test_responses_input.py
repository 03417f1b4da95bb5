"""Responses bodies and stored items → the internal conversation."""

from __future__ import annotations

import pytest
from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.responses_input import input_items, to_conversation, tool_namespaces
from sparkinfer.api.schemas.responses import ResponsesRequest


def _req(**fields: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "Hi", **fields})


def test_items_map_to_chat_messages() -> None:
    history = [
        {"type": "message", "role": "user", "content": "Weather?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Tool."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Rome"}'},
    ]
    req = _req(
        instructions="Be brief.",
        input=[
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        max_output_tokens=9,
        reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
    )
    conv = to_conversation(req, history)
    msgs = conv.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[0].content == "Be brief."
    assert msgs[2].reasoning_content == "Tool." and msgs[2].tool_calls is not None
    assert msgs[3].tool_call_id == "c1"
    assert conv.limits.max_tokens == 9 and conv.response_format is not None
    assert ("messages[1]", "previous_response_id") in conv.paths
    assert ("messages[4]", "input[1]") in conv.paths


def test_system_items_stay_in_place_after_the_instructions() -> None:
    """The core's one rule (chat_render) merges the leading ones, as for every protocol."""
    req = _req(
        instructions="A",
        input=[{"role": "developer", "content": "B"}, {"role": "user", "content": "Hi"}],
    )
    msgs = to_conversation(req, []).messages
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "A"), ("system", "B"), ("user", "Hi")
    ]  # fmt: skip


def test_string_input_is_one_user_message() -> None:
    assert input_items(_req()) == [{"type": "message", "role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"tools": [{"type": "custom", "name": "patch"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
    ],
)
def test_unsupported_items_name_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        to_conversation(_req(**fields), [])
    assert err.value.param == param


def test_namespaces_are_flattened_and_hosted_tools_left_out() -> None:
    fn = {"type": "function", "name": "close", "parameters": {"type": "object"}}
    req = _req(
        tools=[
            {"type": "web_search", "external_web_access": False},
            {"type": "namespace", "name": "agents", "description": "d", "tools": [fn]},
            {**fn, "name": "run"},
        ],
        input=[
            {"role": "user", "content": "Hi"},
            {
                "type": "function_call",
                "call_id": "c",
                "name": "close",
                "namespace": "agents",
                "arguments": "{}",
            },
        ],
    )
    conv = to_conversation(req, [])
    assert [t.function.name for t in conv.tools] == ["agents.close", "run"]
    assert ("tools[0].function", "tools[1].tools[0]") in conv.paths
    calls = conv.messages[1].tool_calls or []
    assert calls[0].function.name == "agents.close"
    assert tool_namespaces(req) == frozenset({"agents"})
