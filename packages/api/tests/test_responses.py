"""The Responses API through the official `openai` client and the Agents SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import openai
import pytest
from sparkinfer.model.embedded import RANDOM_MODEL_ID

from .conftest import RunningServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
NO_THINKING = {"effort": "none"}
ENDS = ("completed", "incomplete")


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_create_text_and_usage(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(
        model=model, input="Hi there", instructions="Be brief.", max_output_tokens=6,
        reasoning=NO_THINKING,  # type: ignore[arg-type]
    )  # fmt: skip
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ENDS
    assert r.instructions == "Be brief."
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in r.output] in (["message"], [])
    assert r.usage is not None and 1 <= r.usage.output_tokens <= 6
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_reasoning_then_text(random_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=random_server.v1, api_key="unused")
    events = list(
        client.responses.create(
            model=RANDOM_MODEL_ID,
            input="Hi there",
            max_output_tokens=12,
            stream=True,
            extra_body={"reasoning": {"effort": "low", "max_tokens": 3}},
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.reasoning_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "reasoning"
    assert 1 <= final.usage.output_tokens_details.reasoning_tokens <= final.usage.output_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    texts = [c.text for item in final.output if item.type == "message" for c in item.content]
    assert deltas == "".join(texts)  # type: ignore[arg-type]


def test_stream_helper_function_call(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(
        model=model,
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=120,
        reasoning=NO_THINKING,  # type: ignore[arg-type]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert final.status == "completed"
    call = next(item for item in final.output if item.type == "function_call")
    assert set(json.loads(call.arguments)) == {"city", "unit"}


def test_function_call_round_trip_retrieve_delete(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(
        model=model,
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=120,
        reasoning=NO_THINKING,  # type: ignore[arg-type]
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert first.status == "completed" and call.name == "get_weather"
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=4,
        reasoning=NO_THINKING,  # type: ignore[arg-type]
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    got = client.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data][-2:] == ["function_call", "function_call_output"]
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=model, input="more", previous_response_id=second.id)
    assert "previous_response_id" in str(err.value)


def test_store_false_is_not_kept(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(
        model=model, input="Hi", max_output_tokens=2, store=False, reasoning=NO_THINKING,  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_json_schema_text_format(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=model,
        input="Answer in JSON",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        max_output_tokens=40,
        reasoning=NO_THINKING,  # type: ignore[arg-type]
    )
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text)["ok"], bool)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "input"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "telepathy"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]"),
        ({"input": "Hi", "tools": [{**WEATHER, "parameters": {"type": 3}}]}, "tools[0].parameters"),
        ({"input": "Hi", "tools": [{"type": "custom", "name": "patch"}]}, "tools[0].type"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "Hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {"type": 7}}}},
            "text.format.schema",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: RunningServer, model: str, body: dict[str, object], field: str
) -> None:
    r = httpx.post(server.v1 + "/responses", json={"model": model, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and field in err["message"], err


def test_agents_sdk_runs_a_one_tool_agent(server: RunningServer, model: str) -> None:
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai.types.shared import Reasoning

    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city (a bounded argument, so random weights finish it)."""
        calls.append(city)
        return f"18 C in {city}"

    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
        model=OpenAIResponsesModel(
            model=model,
            openai_client=openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0),
        ),
        model_settings=ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,
            reasoning=Reasoning(effort="none"),
        ),
    )
    result = asyncio.run(
        Runner.run(agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True))
    )
    assert len(calls) == 1 and result.final_output == f"18 C in {calls[0]}"


ODD_BODIES = [
    [1, 2],
    {"input": 5},
    {"input": [5]},
    {"input": []},
    {"input": [{"role": "user", "content": 5}]},
    {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
    {"input": [{"type": "function_call"}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}]},
    {"input": [{"type": "function_call_output", "call_id": "c"}]},
    {"input": [{"type": "item_reference", "id": "msg_1"}]},
    {"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
    {"input": "Hi", "tools": [{"type": "function"}]},
    {"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
    {"input": "Hi", "tools": [WEATHER, WEATHER]},
    {"input": "Hi", "text": {"format": {"type": "json_schema"}}},
    {"input": "Hi", "text": {"format": {"type": "yaml"}}},
    {"input": "Hi", "temperature": 3},
    {"input": "Hi", "instructions": 5},
    {"input": "Hi", "metadata": {"a": 1}},
    {"input": "Hi", "background": True},
    {"input": "Hi", "conversation": "conv_1"},
    {"input": "Hi", "previous_response_id": "resp_nope"},
    {"input": "Hi", "model": "gpt-none"},
]


@pytest.mark.parametrize("body", ODD_BODIES)
def test_odd_bodies_are_client_errors(server: RunningServer, model: str, body: object) -> None:
    sent = {"model": model, **body} if isinstance(body, dict) else body
    r = httpx.post(server.v1 + "/responses", json=sent, timeout=30)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["type"] in ("invalid_request_error", "not_found_error") and err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_output_text_logprobs_when_included(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    """include message.output_text.logprobs (with top_logprobs): the answer's tokens only,
    spelling its text exactly; without it, none."""
    kw = {"model": model, "input": "Write a function that adds two numbers.", "store": False}
    kw |= {"max_output_tokens": 16, "reasoning": {"effort": "none"}, "temperature": 0}
    included = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    if stream:
        events = list(client.responses.create(**kw, **included, stream=True))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        entries = [lp for e in deltas for lp in e.logprobs or []]
        response = events[-1].response  # type: ignore[union-attr]
        done = next(e for e in events if e.type == "response.output_text.done")
        assert [lp.token for lp in done.logprobs or []] == [lp.token for lp in entries]
    else:
        response = client.responses.create(**kw, **included)
        part = response.output[-1].content[0]  # type: ignore[union-attr]
        entries = part.logprobs or []  # type: ignore[union-attr]
    text = response.output_text
    assert text and bytes(b for e in entries for b in e.bytes or []).decode() == text
    assert all(len(e.top_logprobs) == 2 for e in entries)
    plain = client.responses.create(**kw)
    assert not plain.output[-1].content[0].logprobs  # type: ignore[union-attr]
