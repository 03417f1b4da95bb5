"""The conversation core: errors named by the protocol's fields, body errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from sparkinfer.api.conversation import internal_request, parse_body, remap_error
from sparkinfer.api.errors import InvalidRequest, InvalidToolSchema
from sparkinfer.api.schemas.messages import MessagesRequest

PATHS = [
    ("messages[0]", "system"),
    ("messages[1]", "messages[0]"),
    ("messages[1].content[0]", "messages[0].content[2]"),
    ("tools[0].function.parameters", "tools[0].input_schema"),
    ("tools[0].function", "tools[0]"),
    ("max_tokens", "max_output_tokens"),
]


def test_the_longest_prefix_renames_param_and_message() -> None:
    err = remap_error(
        InvalidToolSchema(
            "tools[0].function.parameters/properties is bad", param="tools[0].function.parameters"
        ),
        PATHS,
    )
    assert err.param == "tools[0].input_schema"
    assert err.message == "tools[0].input_schema/properties is bad"
    err = remap_error(
        InvalidRequest("messages[1].content[0].text: x", param="messages[1].content[0].text"), PATHS
    )
    assert err.param == "messages[0].content[2].text" and err.message.startswith(
        "messages[0].content[2]"
    )


def test_unmapped_and_unnamed_errors_stay() -> None:
    assert remap_error(InvalidRequest("x", param="seed"), PATHS).param == "seed"
    assert remap_error(InvalidRequest("x"), PATHS).param is None
    err = remap_error(InvalidRequest("max_tokens is 9", param="max_tokens"), PATHS)
    assert err.message == "max_output_tokens is 9"


def test_body_errors_name_fields_without_union_tags() -> None:
    body = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "text"}]}],
    }
    with pytest.raises(InvalidRequest) as err:
        parse_body(MessagesRequest, body)
    assert err.value.param == "messages[0].content[0].text"
    body["messages"] = [{"role": "user", "content": [{"type": "image", "source": 3}]}]
    with pytest.raises(InvalidRequest) as err:
        parse_body(MessagesRequest, body)
    assert err.value.param == "messages[0].content[0].source"


def test_a_missing_field_is_named() -> None:
    class Body(BaseModel):
        a: int

    with pytest.raises(InvalidRequest, match=r"^a is required"):
        parse_body(Body, {})


def test_internal_request_errors_name_the_protocol_field() -> None:
    fields = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}
    with pytest.raises(InvalidRequest) as err:
        internal_request(fields, PATHS)
    assert err.value.param == "max_output_tokens"


def test_only_whole_names_are_renamed() -> None:
    err = remap_error(
        InvalidRequest("nonstop stop, stops", param="stop"), [("stop", "stop_sequences")]
    )
    assert err.message == "nonstop stop_sequences, stops"
