"""The conversation core: errors named by the protocol's fields, body errors, and the three
protocols (chat completions, Messages, Responses) giving the same answers through it."""

from __future__ import annotations

import anthropic
import openai
import pytest
from pydantic import BaseModel
from sparkinfer.api.conversation_value import internal_request, parse_body, remap_error
from sparkinfer.api.errors import InvalidRequest, InvalidToolSchema
from sparkinfer.api.schemas.messages import MessagesRequest
from sparkinfer.model.embedded import EMBEDDED_MODEL_ID

from .conftest import RunningServer

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


# The three protocols through the one core, with the official clients.

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = EMBEDDED_MODEL_ID


@pytest.fixture(scope="module")
def openai_client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def anthropic_client(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_the_token_limit_is_reported_as_cut(
    openai_client: openai.OpenAI, anthropic_client: anthropic.Anthropic, stream: bool
) -> None:
    """A forced call with too few tokens to close: `length` / `max_tokens` / `incomplete` in
    the three protocols, and no call markup in any text."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}
    chat_kw = {"model": MODEL, "messages": USER, "max_tokens": 6, "tools": [tool]}
    chat_kw |= {"tool_choice": "required", "extra_body": {"enable_thinking": False}}
    if stream:
        chunks = list(openai_client.chat.completions.create(**chat_kw, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = openai_client.chat.completions.create(**chat_kw).choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
    assert finish == "length" and "<" not in text

    weather = {"name": "get_weather", "input_schema": WEATHER_PARAMS}
    msg_kw = {"model": MODEL, "max_tokens": 6, "messages": USER, "tools": [weather]}
    msg_kw |= {"tool_choice": {"type": "any"}}
    if stream:
        with anthropic_client.messages.stream(**msg_kw) as events:
            message = events.get_final_message()
    else:
        message = anthropic_client.messages.create(**msg_kw)
    assert message.stop_reason == "max_tokens"
    assert all("<" not in getattr(b, "text", "") for b in message.content), message.content

    fn = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS}
    resp_kw = {"model": MODEL, "input": USER[0]["content"], "tools": [fn]}
    resp_kw |= {"tool_choice": "required", "max_output_tokens": 6, "store": False}
    resp_kw |= {"reasoning": {"effort": "none"}}
    if stream:  # the client's stream helper waits for response.completed: read the events
        events = list(openai_client.responses.create(**resp_kw, stream=True))
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = openai_client.responses.create(**resp_kw)
    assert response.status == "incomplete" and "<" not in response.output_text
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("is_prefilled", [False, True])
def test_the_three_protocols_answer_one_conversation_alike(
    openai_client: openai.OpenAI, anthropic_client: anthropic.Anthropic, is_prefilled: bool
) -> None:
    """Two leading system messages, one after a user turn, optionally an assistant prefill:
    one prompt and one greedy answer in chat completions, Messages and Responses."""
    prefill = [{"role": "assistant", "content": "def add("}] if is_prefilled else []
    chat = openai_client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Write Python."},
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Add two numbers."},
            {"role": "system", "content": "Name it add."},
            *prefill,
        ],  # type: ignore[list-item]
        max_tokens=12, temperature=0, extra_body={
            "enable_thinking": False, "continue_final_message": is_prefilled
        },
    )  # fmt: skip
    message = anthropic_client.messages.create(
        model=MODEL,
        system="Write Python.",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add two numbers."},
            {"role": "system", "content": "Name it add."},
            *prefill,
        ],  # type: ignore[list-item]
        max_tokens=12, extra_body={"temperature": 0},
    )  # fmt: skip
    response = openai_client.responses.create(
        model=MODEL,
        instructions="Write Python.",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Add two numbers."},
            {"role": "system", "content": "Name it add."},
        ],
        max_output_tokens=12, temperature=0, reasoning={"effort": "none"}, store=False,
    )  # fmt: skip
    assert chat.usage is not None and response.usage is not None
    cached = message.usage.cache_read_input_tokens or 0
    assert chat.usage.prompt_tokens == message.usage.input_tokens + cached
    text = "".join(b.text for b in message.content if b.type == "text")
    assert chat.choices[0].message.content == text
    if not is_prefilled:  # Responses has no prefill (OpenAI's neither)
        assert response.usage.input_tokens == chat.usage.prompt_tokens
        assert response.output_text == text
