"""Qwen XML tool-call parsing: conversion by schema, bad blocks as text, streaming = whole text."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from sparkinfer.api.tool_parser import (
    ParsedToolCalls,
    ToolCallParser,
    convert_value,
    new_call_id,
    schema_types,
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "units": {"enum": ["metric", "imperial"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "configure",
            "parameters": {
                "type": "object",
                "properties": {
                    "config": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "enabled": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "note": {"type": ["string", "null"]},
                    "level": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def parser() -> ToolCallParser:
    counter = itertools.count()
    return ToolCallParser(TOOLS, make_call_id=lambda: f"call_{next(counter)}")


def parse(text: str) -> ParsedToolCalls:
    return parser().parse(text)


def args(result: ParsedToolCalls, i: int = 0) -> dict[str, Any]:
    return json.loads(result.calls[i].arguments)


def test_single_call_converts_by_schema() -> None:
    result = parse(call("get_weather", city="Paris", days="3", units="metric"))
    assert result.content == ""
    assert [c.name for c in result.calls] == ["get_weather"]
    assert args(result) == {"city": "Paris", "days": 3, "units": "metric"}
    assert result.calls[0].to_openai() == {
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": result.calls[0].arguments},
    }


def test_multiline_value_strips_one_newline_each_side() -> None:
    code = "\ndef f():\n    return 1\n\n"
    result = parse(call("write_file", path="a.py", content=code))
    assert args(result) == {"path": "a.py", "content": code}
    raw = "<tool_call>\n<function=write_file>\n<parameter=content>\n\n  x  \n\n</parameter>\n"
    assert args(parse(raw + "</function>\n</tool_call>")) == {"content": "\n  x  \n"}


def test_nested_json_values() -> None:
    config = {"db": {"hosts": ["a", "b"], "port": 5432}, "ok": None}
    result = parse(
        call(
            "configure",
            config=json.dumps(config, indent=2),
            tags='["x", "y"]',
            enabled="true",
            ratio="0.25",
            note="null",
            level="3",
        )
    )
    assert args(result) == {
        "config": config,
        "tags": ["x", "y"],
        "enabled": True,
        "ratio": 0.25,
        "note": None,
        "level": 3,
    }


def test_value_containing_closing_tag_text() -> None:
    text = "a </parameter> b"
    assert args(parse(call("write_file", content=text))) == {"content": text}


def test_several_calls_and_surrounding_text() -> None:
    text = (
        "Let me check both.\n\n"
        + call("get_weather", city="Paris")
        + "\n"
        + call("get_weather", city="Oslo", days="2")
        + "\n\nDone."
    )
    result = parse(text)
    assert result.content == "Let me check both.\n\nDone."
    assert [args(result, i) for i in range(2)] == [{"city": "Paris"}, {"city": "Oslo", "days": 2}]
    assert [c.id for c in result.calls] == ["call_0", "call_1"]


def test_call_without_parameters() -> None:
    result = parse("<tool_call>\n<function=ping>\n</function>\n</tool_call>")
    assert [(c.name, c.arguments) for c in result.calls] == [("ping", "{}")]


def test_unknown_tool_stays_text() -> None:
    text = "Hmm.\n\n" + call("delete_everything", really="yes")
    result = parse(text)
    assert result.calls == [] and result.content == text
    assert ToolCallParser(None).parse(call("ping")).content == call("ping")


@pytest.mark.parametrize(
    "text",
    [
        "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\ngarbage\n</function>\n</tool_call>",
        '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>",
        "text then <tool_call",
    ],
)
def test_malformed_or_truncated_calls_are_text(text: str) -> None:
    result = parse(text)
    assert result.calls == [] and result.content == text


def test_stray_open_tag_before_a_real_call() -> None:
    text = "<tool_call> oops " + call("ping")
    result = parse(text)
    assert result.content == "<tool_call> oops" and [c.name for c in result.calls] == ["ping"]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call>",
        "<tool_call>\n\n<function=get_weather>\n\n<parameter=city>\nParis\n</parameter>\n\n"
        "</function>\n\n</tool_call>",
        "<tool_call>  <function= get_weather >  <parameter= city >\nParis\n</parameter>  "
        "</function>  </tool_call>",
    ],
)
def test_whitespace_variants(text: str) -> None:
    result = parse(text)
    assert result.content == "" and args(result) == {"city": "Paris"}


def test_text_without_calls_is_unchanged() -> None:
    for text in ["", "  plain answer \n", "a < b and c > d", "<tool", "x\n\n"]:
        assert parse(text) == ParsedToolCalls(text, [])


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ("42", {"type": "string"}, "42"),
        (" spaced ", {"type": "string"}, " spaced "),
        ("42", {"type": "integer"}, 42),
        ("4.0", {"type": "integer"}, 4),
        ("+5", {"type": "integer"}, 5),
        ("many", {"type": "integer"}, "many"),
        ("2.5", {"type": "number"}, 2.5),
        (".5", {"type": "number"}, 0.5),
        ("NaN", {"type": "number"}, "NaN"),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("{'a': True}", {"type": "object"}, {"a": True}),
        ("{broken", {"type": "object"}, "{broken"),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("null", {"type": ["integer", "null"]}, None),
        ("null", {"type": "string"}, "null"),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
        ("seven", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "seven"),
        ('{"x": 1}', {"oneOf": [{"type": "object"}, {"type": "null"}]}, {"x": 1}),
        ("b", {"enum": ["a", "b"]}, "b"),
        ("3", {"enum": [1, 2, 3]}, 3),
        ("12", None, 12),
        ("hello", None, "hello"),
        ('"quoted"', {}, "quoted"),
    ],
)
def test_convert_value(value: str, schema: dict[str, Any] | None, expected: Any) -> None:
    assert convert_value(value, schema) == expected


def test_local_refs_resolve() -> None:
    root = {
        "$defs": {
            "unit": {"type": "string"},
            "n": {"$ref": "#/$defs/count"},
            "count": {"type": "integer"},
        },
        "properties": {"loop": {"$ref": "#/$defs/loop"}},
    }
    root["$defs"]["loop"] = {"$ref": "#/$defs/loop"}
    assert convert_value("123", {"$ref": "#/$defs/unit"}, root=root) == "123"
    assert convert_value("7", {"$ref": "#/$defs/n"}, root=root) == 7
    assert convert_value("7", {"$ref": "#/$defs/missing"}, root=root) == 7
    assert convert_value("x", {"$ref": "#/$defs/loop"}, root=root) == "x"
    assert schema_types({"$ref": "https://example.com/s.json"}, root=root) == set()


def test_schema_types() -> None:
    assert schema_types({"type": ["str", "NULL"]}) == {"string", "null"}
    assert schema_types({"anyOf": [{"type": "integer"}, {}]}) == set()
    assert schema_types(None) == set()


def test_new_call_id_shape() -> None:
    ids = {new_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("call_") and len(i) == 29 and int(i[5:], 16) >= 0 for i in ids)


STREAM_CASES = [
    "Let me look.\n\n"
    + call("get_weather", city="Paris", days="2")
    + "\n"
    + call("write_file", path="x", content="a\n<b>\n")
    + "\n\nAll done. ",
    call("configure", config='{"a": [1, {"b": null}]}', enabled="false") + "\n",
    "No tools here, just < and <tool and </tool_call> text.  \n",
    "Sure.\n\n" + call("nope", a="1") + "\n" + call("ping"),
    "Cut off: <tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "<tool_call> stray\n" + call("ping") + " tail",
]


def stream_all(chunks: list[str]) -> tuple[str, list[dict[str, Any]]]:
    stream = parser().stream()
    content: list[str] = []
    deltas: list[dict[str, Any]] = []
    for delta in [*(stream.feed(c) for c in chunks), stream.finish()]:
        content.append(delta.content)
        deltas += [d.to_openai() for d in delta.calls]
        assert "<tool_call>" not in delta.content or "<tool_call>" in parse("".join(chunks)).content
    return "".join(content), deltas


def calls_from_deltas(deltas: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if "id" in d:
            assert d["type"] == "function" and d["function"]["arguments"] == ""
            calls[d["index"]] = [d["id"], d["function"]["name"], ""]
        else:
            calls[d["index"]][2] += d["function"]["arguments"]
    return [(i, n, a) for i, n, a in (calls[k] for k in sorted(calls))]


@pytest.mark.parametrize("text", STREAM_CASES)
def test_streaming_equals_whole_text_at_every_split(text: str) -> None:
    whole = parse(text)
    expected = (whole.content, [(c.id, c.name, c.arguments) for c in whole.calls])
    for cut in range(len(text) + 1):
        content, deltas = stream_all([text[:cut], text[cut:]])
        assert (content, calls_from_deltas(deltas)) == expected, cut
    content, deltas = stream_all(list(text))
    assert (content, calls_from_deltas(deltas)) == expected
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(5, len(text))))
        chunks = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
        content, deltas = stream_all(chunks)
        assert (content, calls_from_deltas(deltas)) == expected


def test_streaming_holds_back_partial_tag() -> None:
    stream = parser().stream()
    assert stream.feed("Checking <tool").content == "Checking"
    assert stream.feed("_ca").content == ""
    delta = stream.feed("ll>\n<function=ping>\n</function>\n</tool_call>")
    assert delta.content == "" and [d.name for d in delta.calls] == ["ping", None]
    assert stream.finish().content == ""
    assert [c.name for c in stream.calls] == ["ping"]
