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
    # usage holds the standard keys only; the engine's telemetry is a field of its own.
    assert not usage.model_extra
    assert chunks[-1].model_extra and chunks[-1].model_extra["timings"]["ttft_ms"] is not None


def test_stream_chunks_omit_absent_fields(server: RunningServer) -> None:
    """OpenAI's chunks leave out what a delta does not carry (no `"content": null`)."""
    body = {"messages": USER, "max_tokens": 4, "stream": True, "logprobs": True}
    body |= {"stream_options": {"include_usage": True}, "enable_thinking": False}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=60) as resp:
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line) for line in lines]
    for chunk in chunks:
        assert None not in chunk.values(), chunk
        for choice in chunk["choices"]:
            assert None not in choice["delta"].values(), chunk
            assert set(choice) == {"index", "delta", "finish_reason", "logprobs"}
    standard = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
    standard |= {"completion_tokens_details"}
    assert "usage" not in chunks[0] and set(chunks[-1]["usage"]) <= standard


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
def test_usage_counts_reasoning_tokens(
    server: RunningServer, client: openai.OpenAI, model: str, stream: bool
) -> None:
    """The tokens up to the model's `</think>` (all of them if it never closes)."""
    kw = {"model": model, "messages": USER, "max_tokens": 12, "seed": 3}
    if stream:
        chunks = list(
            client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}
            )
        )
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(**kw).usage
    # The same prompt and seed through /v1/completions shows every sampled token.
    ids = httpx.post(server.v1 + "/tokenize", json={"messages": USER}).json()["tokens"]
    raw = client.completions.create(model=model, prompt=ids, max_tokens=12, seed=3, logprobs=0)
    assert raw.choices[0].logprobs is not None
    tokens = raw.choices[0].logprobs.tokens or []
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


def _spelled(entries: list) -> str:
    """The text the logprob entries' tokens spell (their bytes joined)."""
    return bytes(b for e in entries for b in e.bytes).decode()


TURNS = {  # (server, extra fields): plain, reasoning, a forced call, auto tools
    "plain": ("server", {"enable_thinking": False}),
    "reasoning": ("random_server", {"reasoning": {"max_tokens": 4}}),
    "tool_call": ("server", {"tools": [WEATHER], "tool_choice": "required"}),
    "auto_tools": ("server", {"tools": [WEATHER, CLOCK], "enable_thinking": False}),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("turn", list(TURNS))
def test_logprob_tokens_spell_the_content(
    request: pytest.FixtureRequest, turn: str, stream: bool
) -> None:
    """logprobs.content covers message.content exactly: no reasoning, `</think>`, newlines
    around it or call markup."""
    fixture, extra = TURNS[turn]
    running: RunningServer = request.getfixturevalue(fixture)
    client = openai.OpenAI(base_url=running.v1, api_key="unused")
    kw = {"model": client.models.list().data[0].id, "messages": USER, "max_tokens": 24}
    kw |= {"logprobs": True, "top_logprobs": 1, "seed": 5, "extra_body": extra}
    if stream:
        chunks = list(client.chat.completions.create(**kw, stream=True))
        choices = [c.choices[0] for c in chunks if c.choices]
        content = "".join(c.delta.content or "" for c in choices)
        reasoning = "".join(getattr(c.delta, "reasoning_content", None) or "" for c in choices)
        entries = [e for c in choices if c.logprobs for e in c.logprobs.content or []]
        assert all(c.delta.content for c in choices if c.logprobs)  # on the content's chunk
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content = choice.message.content or ""
        reasoning = getattr(choice.message, "reasoning_content", None) or ""
        assert choice.logprobs is not None
        entries = choice.logprobs.content or []
    assert _spelled(entries) == content
    if content.isascii():
        assert "".join(e.token for e in entries) == content
    if turn == "reasoning":
        assert reasoning and content  # both were there, only the content has logprobs


def test_legacy_functions_are_tools(client: openai.OpenAI, model: str) -> None:
    """The deprecated `functions` / `function_call` fields and the `function` role."""
    history = [
        *USER,
        {"role": "assistant", "content": None, "function_call": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'
        }},
        {"role": "function", "name": "get_weather", "content": "18 C"},
        {"role": "user", "content": "And in Rome?"},
    ]  # fmt: skip
    r = client.chat.completions.create(
        model=model,
        messages=history,  # type: ignore[arg-type]
        functions=[WEATHER["function"]],  # type: ignore[list-item]
        function_call={"name": "get_weather"},
        max_tokens=60,
        extra_body={"enable_thinking": False},
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    none = client.chat.completions.create(
        model=model, messages=USER, functions=[WEATHER["function"]],  # type: ignore[list-item]
        function_call="none", max_tokens=4, extra_body={"enable_thinking": False},
    )  # fmt: skip
    assert not none.choices[0].message.tool_calls


@pytest.mark.parametrize("seed", range(4))
def test_auto_calls_are_declared_and_valid_never_markup(
    client: openai.OpenAI, model: str, seed: int
) -> None:
    """The weather question with only the clock declared: the grammar holds any call the model
    opens to get_time and its schema; nothing comes back as raw call markup."""
    r = client.chat.completions.create(
        model=model, messages=USER, tools=[CLOCK], tool_choice="auto",  # type: ignore[list-item]
        max_tokens=60, seed=seed, extra_body={"enable_thinking": seed % 2 == 0},
    )  # fmt: skip
    message = r.choices[0].message
    assert "<tool_call>" not in (message.content or "") and "<function" not in (
        message.content or ""
    )
    for call in message.tool_calls or []:
        assert call.function.name == "get_time"  # type: ignore[union-attr]
        args = json.loads(call.function.arguments)  # type: ignore[union-attr]
        assert set(args) <= {"utc"} and all(isinstance(v, bool) for v in args.values())
