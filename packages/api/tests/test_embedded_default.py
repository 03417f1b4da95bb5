"""The embedded default model through HTTP: transformers' greedy tokens, forced tool calls that
close and validate, tool calls under tool_choice auto that pick the right declared tool with the
prompt's arguments (and never an undeclared one), and JSON answers that carry the prompt's values.
The checks other than the greedy one run at the checkpoint's default sampling, one seed each."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch
from sparkinfer.model.embedded import EMBEDDED_MODEL_ID, embedded_checkpoint_dir
from sparkinfer.model.tokenizer import Tokenizer

from .conftest import RunningServer, serve

CODE_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(folder):\n",
    "class Stack:\n    def __init__(self):\n",
    'def read_json(path):\n    """Read a JSON file and return its contents."""\n',
    "for i in range(10):\n",
)
NEW_TOKENS = 24
TOOL = {
    "type": "function",
    "function": {
        "name": "book_hotel",
        "description": "Book a hotel.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "nights": {"type": "integer", "description": "The nights"},
            },
            "required": ["city", "nights"],
        },
    },
}
TOOL_REQUESTS = (
    "Please book the hotel with city Paris and nights 3.",
    "Book the hotel for city Tokyo and nights 2.",
    "Can you book a hotel? Use city Lima and nights 5.",
    "I need to book the hotel: city Oslo and nights 1.",
    "Use the tool to book the hotel with city Cairo and nights 7.",
    "Please book a hotel in Berlin for 4 nights.",
    "Book the hotel with city Madrid and nights 10.",
    "I need a hotel in Toronto for 2 nights.",
    "Please book the hotel with city Nairobi and nights 6.",
    "Book the hotel for city Rome and nights 3.",
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                   "age": {"type": "integer"}},
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}  # fmt: skip
PEOPLE = (
    ("Alice", "Paris", 31), ("Bob", "Tokyo", 45), ("Carol", "Lima", 27), ("Dmitri", "Oslo", 52),
    ("Esther", "Cairo", 38), ("Farid", "Madrid", 19), ("Grace", "Berlin", 64),
    ("Hiro", "Toronto", 23), ("Ingrid", "Nairobi", 40), ("Jamal", "Rome", 33),
)  # fmt: skip
GOAL = 8  # of 10 prompts
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "days": {"type": "integer", "description": "Number of days"},
            },
            "required": ["city", "days"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add_numbers",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first number"},
                "b": {"type": "integer", "description": "The second number"},
            },
            "required": ["a", "b"],
        },
    },
}
AUTO_REQUESTS = (
    ("What's the weather in Paris for the next 3 days?", "get_weather",
     {"city": "Paris", "days": 3}),
    ("Give me the 5-day forecast for Tokyo.", "get_weather", {"city": "Tokyo", "days": 5}),
    ("How will the weather be in Lima over the next 2 days?", "get_weather",
     {"city": "Lima", "days": 2}),
    ("I'm flying to Oslo. What will the weather be like for 7 days?", "get_weather",
     {"city": "Oslo", "days": 7}),
    ("Weather in Cairo for 4 days, please.", "get_weather", {"city": "Cairo", "days": 4}),
    ("What is 17 plus 25?", "add_numbers", {"a": 17, "b": 25}),
    ("Add 120 and 38.", "add_numbers", {"a": 120, "b": 38}),
    ("Compute the sum of 9 and 301.", "add_numbers", {"a": 9, "b": 301}),
    ("What do 64 and 36 add up to?", "add_numbers", {"a": 64, "b": 36}),
    ("Please add 450 + 7.", "add_numbers", {"a": 450, "b": 7}),
)  # fmt: skip


@pytest.fixture(scope="module")
def default_server() -> Iterator[RunningServer]:
    with serve(max_num_seqs=10) as running:
        yield running


@pytest.fixture(scope="module")
def client(default_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.v1, api_key="none", max_retries=0)


def test_serves_the_trained_checkpoint(default_server: RunningServer) -> None:
    models = httpx.get(default_server.v1 + "/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [EMBEDDED_MODEL_ID]


def test_greedy_text_equals_transformers_generate(default_server: RunningServer) -> None:
    from transformers import Qwen3_5ForCausalLM

    folder = embedded_checkpoint_dir()
    tok = Tokenizer.from_checkpoint(folder)
    hf = Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt in CODE_PROMPTS:
        ids = tok.encode(prompt)
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                eos_token_id=None,
            )  # fmt: skip
        body = {"prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        resp = httpx.post(default_server.v1 + "/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        new = out[0, len(ids) :].tolist()
        assert resp.json()["choices"][0]["text"] == tok.decode(new, skip_special=True)


def test_forced_tool_calls_close_and_validate(client: openai.OpenAI) -> None:
    good = 0
    for request in TOOL_REQUESTS:
        r = client.chat.completions.create(
            model=EMBEDDED_MODEL_ID,
            messages=[{"role": "user", "content": request}],
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="required",
            temperature=0,
            max_tokens=64,
        )
        choice = r.choices[0]
        calls = choice.message.tool_calls or []
        if choice.finish_reason != "tool_calls" or len(calls) != 1:
            continue
        try:
            jsonschema.validate(json.loads(calls[0].function.arguments),  # type: ignore[union-attr]
                                TOOL["function"]["parameters"])  # fmt: skip
        except (ValueError, jsonschema.ValidationError):
            continue
        good += 1
    print(f"{good} of {len(TOOL_REQUESTS)} forced tool calls closed and validated")
    assert good >= GOAL


@dataclass(frozen=True)
class AutoReply:
    calls: list[tuple[str, dict[str, Any]]]  # parsed calls: (name, arguments)
    raw_names: list[str]  # names in call markup the server left in the content


@pytest.fixture(scope="module")
def auto_replies(client: openai.OpenAI) -> list[AutoReply]:
    """AUTO_REQUESTS under tool_choice auto with WEATHER and ADD declared, default sampling."""
    replies = []
    for seed, (request, _, _) in enumerate(AUTO_REQUESTS):
        r = client.chat.completions.create(
            model=EMBEDDED_MODEL_ID,
            messages=[{"role": "user", "content": request}],
            tools=[WEATHER, ADD],  # type: ignore[list-item]
            tool_choice="auto",
            seed=seed,
            max_tokens=96,
        )
        message = r.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments))  # type: ignore[union-attr]
                 for c in message.tool_calls or []]  # fmt: skip
        raw = re.findall(r"<function=([^>\n]*)>", message.content or "")
        print(f"{request!r}: {calls} {message.content!r}")
        replies.append(AutoReply(calls, raw))
    return replies


def test_auto_tool_calls_never_name_an_undeclared_tool(auto_replies: list[AutoReply]) -> None:
    declared = {WEATHER["function"]["name"], ADD["function"]["name"]}
    for (request, _, _), reply in zip(AUTO_REQUESTS, auto_replies, strict=True):
        names = [name for name, _ in reply.calls] + reply.raw_names
        assert set(names) <= declared, f"{request!r} called an undeclared tool: {names}"


def test_auto_tool_calls_pick_the_right_tool_with_the_prompts_arguments(
    auto_replies: list[AutoReply],
) -> None:
    right = sum(
        reply.calls == [(name, arguments)] and not reply.raw_names
        for (_, name, arguments), reply in zip(AUTO_REQUESTS, auto_replies, strict=True)
    )
    tools = sum(
        [n for n, _ in reply.calls] + reply.raw_names == [name]
        for (_, name, _), reply in zip(AUTO_REQUESTS, auto_replies, strict=True)
    )
    print(f"{tools} of {len(AUTO_REQUESTS)} auto replies named the right tool; {right} also "
          "called it with the prompt's arguments")  # fmt: skip
    assert right >= GOAL


def test_json_schema_answers_carry_the_prompts_values(client: openai.OpenAI) -> None:
    good = 0
    for seed, (name, city, age) in enumerate(PEOPLE):
        prompt = (
            "Reply with a JSON object with the fields name (a string), city (a string), age "
            f"(an integer) for: {name} lives in {city} and is {age} years old."
        )
        r = client.chat.completions.create(
            model=EMBEDDED_MODEL_ID,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON}},
            seed=seed,
            max_tokens=64,
        )  # fmt: skip
        choice = r.choices[0]
        if choice.finish_reason != "stop" or choice.message.content is None:
            continue
        try:
            value = json.loads(choice.message.content)
            jsonschema.validate(value, PERSON)
        except (ValueError, jsonschema.ValidationError):
            continue
        good += value == {"name": name, "city": city, "age": age}
    print(f"{good} of {len(PEOPLE)} JSON answers carried the prompt's values")
    assert good >= GOAL


def test_a_greeting_says_what_the_model_is(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=EMBEDDED_MODEL_ID, messages=[{"role": "user", "content": "Hello"}], seed=0,
        max_tokens=96,
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert "qwen3.8-code-tiny" in (r.choices[0].message.content or "")
