"""Chat completions through the official OpenAI client against the real server (random weights)."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from .conftest import RunningServer

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$comment": "bounded so that random weights finish quickly",
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "unit": {"$ref": "#/$defs/unit"},
            },
            "required": ["city", "unit"],
            "$defs": {"unit": {"type": "string", "enum": ["c", "f"]}},
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}},
    },
}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused")


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_chat_usage_and_length_finish(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=USER, max_tokens=4)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + 4
    assert r.usage.prompt_tokens_details is not None
    # Thinking is on by default: the tokens are reasoning, under both names.
    assert choice.message.reasoning_content == choice.message.reasoning  # type: ignore[attr-defined]


def test_chat_stream_with_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=USER,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"enable_thinking": False},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 5
    assert usage.model_extra and usage.model_extra["ttft_ms"] is not None


def test_stop_string_is_trimmed(client: openai.OpenAI, model: str) -> None:
    args = {"model": model, "messages": USER, "max_tokens": 12, "temperature": 0}
    args["extra_body"] = {"enable_thinking": False}
    full = client.chat.completions.create(**args).choices[0].message.content or ""
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    r = client.chat.completions.create(**args, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index(stop)]


def test_several_requests_in_flight(server: RunningServer, model: str) -> None:
    async def run() -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=server.v1, api_key="unused")
        rs = await asyncio.gather(
            *[
                aclient.chat.completions.create(
                    model=model, messages=USER, max_tokens=3 + i, seed=i
                )
                for i in range(4)
            ]
        )
        return [r.usage.completion_tokens for r in rs if r.usage]

    assert asyncio.run(run()) == [3, 4, 5, 6]


def test_n_choices_and_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
        extra_body={"enable_thinking": False},
    )
    assert [c.index for c in r.choices] == [0, 1]
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 3
    assert len(lp.content[0].top_logprobs) == 2


@pytest.mark.parametrize("thinking", [False, True])
def test_required_tool_choice_yields_a_valid_call(
    client: openai.OpenAI, model: str, thinking: bool
) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        extra_body={"enable_thinking": thinking, "reasoning": {"max_tokens": 3}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert calls[0].function.name in ("get_weather", "get_time")
    args = json.loads(calls[0].function.arguments)
    if calls[0].function.name == "get_weather":
        jsonschema.validate(args, WEATHER["function"]["parameters"])
    reasoning = choice.message.reasoning_content  # type: ignore[attr-defined]
    assert thinking or not reasoning  # with thinking off, the call is never reasoning


def test_named_tool_choice_streams_the_call(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[WEATHER, CLOCK],
        max_tokens=160,
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"enable_thinking": False},
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or "" if call.function else ""
                arguments += call.function.arguments or "" if call.function else ""
            finish = choice.finish_reason or finish
    assert (name, finish) == ("get_weather", "tool_calls")
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_json_schema_output_validates(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
        "required": ["ok", "size"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        response_format=fmt,
        max_tokens=100,  # type: ignore[arg-type]
        extra_body={"reasoning": {"max_tokens": 4}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_json_schema_output_cut_by_max_tokens_is_length(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        response_format=fmt,  # type: ignore[arg-type]
        max_tokens=2,
        n=2,
        extra_body={"enable_thinking": False},
    )
    assert [c.finish_reason for c in r.choices] == ["length", "length"]
    assert r.usage is not None and r.usage.prompt_tokens < 30  # the prompt counted once


def test_stop_with_json_output_is_refused(server: RunningServer, model: str) -> None:
    fmt = {"type": "json_object"}
    body = {"model": model, "messages": USER, "response_format": fmt, "stop": ["}"]}
    err = httpx.post(server.v1 + "/chat/completions", json=body).json()["error"]
    assert (err["code"], err["param"]) == ("invalid_value", "stop")


def test_remote_ref_is_refused_with_a_reason(server: RunningServer, model: str) -> None:
    params = {"type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}}
    bad = {"type": "function", "function": {"name": "f", "parameters": params}}
    body = {"model": model, "messages": USER, "tools": [bad], "max_tokens": 1}
    err = httpx.post(server.v1 + "/chat/completions", json=body).json()["error"]
    assert err["code"] == "invalid_tool_schema" and "never fetches" in err["message"]


def test_reasoning_controls_precedence(client: openai.OpenAI, model: str) -> None:
    # enable_thinking beats the reasoning object, which beats reasoning_effort.
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=3,
        reasoning_effort="high",
        extra_body={"enable_thinking": False, "reasoning": {"enabled": True}},
    )
    assert not getattr(r.choices[0].message, "reasoning_content", None)
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=3,
        reasoning_effort="none",
        extra_body={"reasoning": {"enabled": True, "exclude": True}},
    )
    assert not getattr(r.choices[0].message, "reasoning_content", None)  # excluded


def test_assistant_history_accepts_both_reasoning_fields(client: openai.OpenAI, model: str) -> None:
    for field in ("reasoning_content", "reasoning"):
        history = [*USER, {"role": "assistant", "content": "Sunny.", field: "look it up"},
                   {"role": "user", "content": "And Rome?"}]  # fmt: skip
        r = client.chat.completions.create(model=model, messages=history, max_tokens=1)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.prompt_tokens > 20


def test_client_disconnect_aborts_the_request(server: RunningServer, model: str) -> None:
    body = {"model": model, "messages": USER, "max_tokens": 500, "stream": True}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=60) as resp:
        for _ in zip(range(3), resp.iter_lines(), strict=False):
            pass
    state = server.app.state.server  # type: ignore[attr-defined]
    for _ in range(200):
        stats = state.engine.engine.stats()
        if stats.num_aborted >= 1 and stats.num_running == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert stats.num_aborted >= 1 and stats.num_running == 0


def test_client_disconnect_aborts_a_whole_response_request(
    server: RunningServer, model: str
) -> None:
    state = server.app.state.server  # type: ignore[attr-defined]
    num_aborted = state.engine.engine.stats().num_aborted
    body = {"model": model, "messages": USER, "max_tokens": 500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up before the answer is whole
        httpx.post(server.v1 + "/chat/completions", json=body, timeout=2)
    for _ in range(200):
        stats = state.engine.engine.stats()
        if stats.num_aborted > num_aborted and stats.num_running == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert stats.num_aborted > num_aborted and stats.num_running == 0


def test_stream_helper_gets_the_parsed_call(client: openai.OpenAI, model: str) -> None:
    """Every streamed tool-call delta says "type": "function", as the SDK's helper needs."""
    with client.chat.completions.stream(
        model=model,
        messages=USER,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=160,
        extra_body={"enable_thinking": False},
    ) as stream:
        for event in stream:
            if event.type == "chunk":
                for choice in event.chunk.choices:
                    assert all(c.type == "function" for c in choice.delta.tool_calls or [])
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_call_cut_by_max_tokens_is_length_without_markup(
    server: RunningServer, model: str, stream: bool
) -> None:
    body = {
        "model": model,
        "messages": USER,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 6,  # inside `<tool_call>\n<function=get_weather>\n...`
        "enable_thinking": False,
        "stream": stream,
    }
    resp = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    if stream:
        chunks = [
            json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")
        ]
        content = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        message = resp.json()["choices"][0]["message"]
        content, finish = message["content"] or "", resp.json()["choices"][0]["finish_reason"]
    assert finish == "length"
    assert "<tool_call>" not in content and "<function" not in content


@pytest.mark.parametrize("stream", [False, True])
def test_usage_counts_reasoning_tokens(client: openai.OpenAI, model: str, stream: bool) -> None:
    """The tokens up to the model's `</think>` (all of them if it never closes)."""
    kw = {"model": model, "messages": USER, "max_tokens": 12, "logprobs": True, "seed": 3}
    if stream:
        chunks = list(
            client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}
            )
        )
        usage = chunks[-1].usage
        entries = [
            e
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content or []
        ]
    else:
        r = client.chat.completions.create(**kw)
        usage = r.usage
        assert r.choices[0].logprobs is not None
        entries = r.choices[0].logprobs.content or []
    tokens = [e.token for e in entries]
    want = tokens.index("</think>") + 1 if "</think>" in tokens else len(tokens)
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == want
    off = client.chat.completions.create(**kw, extra_body={"enable_thinking": False}).usage
    assert off is not None and off.completion_tokens_details is not None
    assert off.completion_tokens_details.reasoning_tokens == 0


def test_forced_call_with_bounded_strings_closes(client: openai.OpenAI, model: str) -> None:
    """maxLength and pattern hold inside the call, so random weights still close it. One call
    only: a model whose string the grammar cut short may go on to a second, parallel call."""
    params = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "note": {"type": "string", "maxLength": 4},
        },
        "required": ["code", "note"],
    }
    tool = {"type": "function", "function": {"name": "tag", "parameters": params}}
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        extra_body={"enable_thinking": False},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    args = json.loads((choice.message.tool_calls or [])[0].function.arguments)
    jsonschema.validate(args, params)
