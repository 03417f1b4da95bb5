"""The Anthropic Messages API through the official `anthropic` client."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from sparkinfer.model.embedded import RANDOM_MODEL_ID

from .conftest import RunningServer, serve

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
    },
}
ENDS = ("end_turn", "max_tokens")


@pytest.fixture(scope="module")
def client(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(server: RunningServer) -> str:
    return httpx.get(server.v1 + "/models").json()["data"][0]["id"]


def test_message_text_and_usage(client: anthropic.Anthropic, model: str) -> None:
    m = client.messages.create(model=model, max_tokens=6, messages=USER, system="Be brief.")
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.stop_reason in ENDS
    assert [b.type for b in m.content] in (["text"], [])  # thinking is off unless asked for
    assert 1 <= m.usage.output_tokens <= 6
    assert m.usage.input_tokens > 0 and m.usage.cache_read_input_tokens is not None


def test_stream_thinking_then_text(random_server: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=random_server.base_url, api_key="unused")
    with client.messages.stream(
        model=RANDOM_MODEL_ID,
        max_tokens=12,
        messages=USER,
        thinking={"type": "enabled", "budget_tokens": 3},
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "message_delta" in kinds
    blocks = [b.type for b in final.content]
    assert blocks[0] == "thinking" and final.content[0].thinking  # type: ignore[union-attr]
    assert final.content[0].signature  # type: ignore[union-attr]
    assert set(blocks) <= {"thinking", "text"}
    assert final.stop_reason in ENDS and final.usage.output_tokens > 0


def test_stream_text_deltas_match_the_whole_text(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(model=model, max_tokens=8, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = "".join(b.text for b in final.content if b.type == "text")
    assert text == whole


def test_tool_round_trip(client: anthropic.Anthropic, model: str) -> None:
    first = client.messages.create(
        model=model,
        max_tokens=120,
        messages=USER,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert first.stop_reason == "tool_use", first.content
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Rome")  # type: ignore[index]
    second = client.messages.create(
        model=model,
        max_tokens=5,
        tools=[WEATHER],
        messages=[
            *USER,
            {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    )
    assert second.stop_reason in (*ENDS, "tool_use")
    assert second.usage.input_tokens > first.usage.input_tokens


def test_streamed_tool_call_input(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(
        model=model,
        max_tokens=120,
        messages=USER,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        final = stream.get_final_message()
    call = next(b for b in final.content if b.type == "tool_use")
    assert final.stop_reason == "tool_use" and set(call.input) == {"city", "unit"}  # type: ignore[arg-type]


def test_stop_sequence_is_reported(client: anthropic.Anthropic, model: str) -> None:
    args = {"model": model, "max_tokens": 12, "messages": USER, "extra_body": {"temperature": 0.0}}
    full = client.messages.create(**args)  # type: ignore[arg-type]
    text = "".join(b.text for b in full.content if b.type == "text")
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip(f"no usable stop sequence in {text!r}")
    m = client.messages.create(**args, stop_sequences=[stop])  # type: ignore[arg-type]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop


def test_system_messages_inside_messages(client: anthropic.Anthropic, model: str) -> None:
    """Claude Code sends role "system" messages after the first user message."""
    messages = [*USER, {"role": "system", "content": "Agents: Explore, Plan."}]
    counted = client.messages.count_tokens(model=model, messages=messages)  # type: ignore[arg-type]
    plain = client.messages.count_tokens(model=model, messages=USER)  # type: ignore[arg-type]
    assert counted.input_tokens > plain.input_tokens
    m = client.messages.create(model=model, max_tokens=2, messages=messages)  # type: ignore[arg-type]
    assert m.usage.output_tokens >= 1


def test_max_tokens_beyond_the_context_is_lowered(
    client: anthropic.Anthropic, model: str, server: RunningServer
) -> None:
    """Clients send their own model's output limit: it is cut to the room the prompt leaves."""
    context = httpx.get(server.v1 + "/models").json()["data"][0]["max_model_len"]
    words = 10
    for _ in range(6):  # grow the prompt until it leaves a few tokens of room
        content = "lorem ipsum " * words
        num_prompt = client.messages.count_tokens(
            model=model, messages=[{"role": "user", "content": content}]
        ).input_tokens
        if 0 < context - num_prompt <= 8:
            break
        words = max(1, words + (context - 4 - num_prompt) * words // num_prompt)
    room = context - num_prompt
    assert 0 < room <= 8
    m = client.messages.create(
        model=model, max_tokens=20_000, messages=[{"role": "user", "content": content}]
    )
    assert m.usage.output_tokens <= room
    assert m.stop_reason in ("model_context_window_exceeded", "end_turn", "stop_sequence")


def test_count_tokens_matches_the_prompt(client: anthropic.Anthropic, model: str) -> None:
    counted = client.messages.count_tokens(model=model, messages=USER, tools=[WEATHER])
    m = client.messages.create(model=model, max_tokens=1, messages=USER, tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": USER}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"max_tokens": 4, "messages": USER, "temperature": 1.5}, "temperature"),
        (
            {
                "max_tokens": 4,
                "messages": USER,
                "tools": [{**WEATHER, "input_schema": {"type": 3}}],
            },
            "tools[0].input_schema",
        ),
        (
            {
                "max_tokens": 4,
                "messages": USER,
                "thinking": {"type": "enabled", "budget_tokens": 9},
            },
            "thinking.budget_tokens",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].source",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: RunningServer, model: str, body: dict[str, object], field: str
) -> None:
    r = httpx.post(server.v1 + "/messages", json={"model": model, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert field in err["error"]["message"], err


def test_sdk_error_types(client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=model, max_tokens=0, messages=USER)  # type: ignore[arg-type]
    assert "max_tokens" in str(bad.value)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-none", max_tokens=4, messages=USER)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=model, messages=[])


def test_x_api_key_and_auth_errors_in_anthropic_shape() -> None:
    with serve(api_key="sekret") as running:
        good = anthropic.Anthropic(base_url=running.base_url, api_key="sekret", max_retries=0)
        ids = httpx.get(running.v1 + "/models", headers={"x-api-key": "sekret"}).json()
        model = ids["data"][0]["id"]
        assert good.messages.create(model=model, max_tokens=1, messages=USER).usage.output_tokens
        bad = anthropic.Anthropic(base_url=running.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as err:
            bad.messages.create(model=model, max_tokens=1, messages=USER)
        assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


_TEXT = [{"role": "user", "content": "Hi"}]
ODD_BODIES = [
    [1, 2],
    {"max_tokens": 4, "messages": "Hi"},
    {"max_tokens": 4, "messages": []},
    {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"max_tokens": 4, "messages": [{"role": "robot", "content": "Hi"}]},
    {"max_tokens": 4, "messages": [{"role": "assistant", "content": "Hi"}]},
    {"max_tokens": 4, "messages": [{"role": "system", "content": "Be kind."}]},
    {
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "!!"},
                    }
                ],
            }
        ],
    },
    {
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
        ],
    },
    {
        "max_tokens": 4,
        "messages": [
            *_TEXT,
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            *_TEXT,
        ],
    },
    {
        "max_tokens": 4,
        "messages": [
            *_TEXT,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
            *_TEXT,
        ],
    },
    {"max_tokens": 4, "messages": _TEXT, "tools": [{"name": "bad name!"}]},
    {"max_tokens": 4, "messages": _TEXT, "tools": [{"name": "f", "type": "web_search_2025"}]},
    {"max_tokens": 4, "messages": _TEXT, "tool_choice": {"type": "any"}},
    {"max_tokens": 4, "messages": _TEXT, "tools": [WEATHER], "tool_choice": {"type": "tool"}},
    {
        "max_tokens": 4,
        "messages": _TEXT,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "nope"},
    },
    {"max_tokens": 4, "messages": _TEXT, "tools": [WEATHER, WEATHER]},
    {"max_tokens": 4, "messages": _TEXT, "system": 5},
    {"max_tokens": 4, "messages": _TEXT, "stop_sequences": [""]},
    {"max_tokens": 4, "messages": _TEXT, "thinking": {"type": "enabled"}},
    {"max_tokens": 4, "messages": _TEXT, "thinking": {"type": "sometimes"}},
    {"max_tokens": 4, "messages": _TEXT, "metadata": "x"},
    {"max_tokens": 4, "messages": _TEXT, "top_k": -1},
    {"max_tokens": 4, "messages": _TEXT, "max_tokens_extra": 1, "model": 5},
    {
        "max_tokens": 4,
        "messages": _TEXT,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": 1}}},
    },
    {"max_tokens": 4, "messages": _TEXT, "output_config": {"effort": "maximal"}},
]


@pytest.mark.parametrize("body", ODD_BODIES)
@pytest.mark.parametrize("path", ["/messages", "/messages/count_tokens"])
def test_odd_bodies_are_client_errors_in_anthropic_shape(
    server: RunningServer, model: str, body: object, path: str
) -> None:
    generation_only = {"stop_sequences", "metadata", "top_k"}
    if path.endswith("count_tokens") and isinstance(body, dict) and generation_only & set(body):
        pytest.skip("count_tokens does not take generation fields")
    sent = {"model": model, **body} if isinstance(body, dict) else body
    r = httpx.post(server.v1 + path, json=sent, timeout=30)
    assert r.status_code in (400, 404), r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] in (
        "invalid_request_error",
        "not_found_error",
    )
    assert err["error"]["message"]


def test_invalid_json_is_an_anthropic_error(server: RunningServer) -> None:
    r = httpx.post(
        server.v1 + "/messages", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "thinking", [{"type": "enabled", "budget_tokens": 16}, {"type": "adaptive"}]
)
def test_thinking_on_always_returns_a_thinking_block(
    client: anthropic.Anthropic, model: str, stream: bool, thinking: dict
) -> None:
    """The trained model often closes its reasoning at once; the block is still there (empty),
    first, as Anthropic's API returns it; thinking off, there is none."""
    kw = {"model": model, "max_tokens": 24, "messages": USER, "thinking": thinking}
    if stream:
        with client.messages.stream(**kw) as events:  # type: ignore[arg-type]
            message = events.get_final_message()
    else:
        message = client.messages.create(**kw)  # type: ignore[arg-type]
    assert message.content[0].type == "thinking"
    assert message.content[0].signature  # type: ignore[union-attr]
    assert [b.type for b in message.content].count("thinking") == 1
    plain = client.messages.create(model=model, max_tokens=4, messages=USER)  # type: ignore[arg-type]
    assert all(b.type != "thinking" for b in plain.content)
