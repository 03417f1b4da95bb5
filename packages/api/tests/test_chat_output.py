"""Chat output checks: auto tool calls validated against their schema, JSON output verified."""

from __future__ import annotations

import pytest
from sparkinfer.api.chat_output import ChatOutput, InvalidStructuredOutput
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.schemas.chat import ChatCompletionRequest
from sparkinfer.api.tools import check_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
USER = [{"role": "user", "content": "hi"}]


def _call(city: str) -> str:
    return (
        f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
        "</function>\n</tool_call>"
    )


def _auto_output() -> ChatOutput:
    req = ChatCompletionRequest(model="m", messages=USER, tools=[WEATHER], tool_choice="auto")
    return ChatOutput(
        is_thinking=False,
        is_reasoning_excluded=False,
        tools=check_tools(Conversation.of(req)),
        is_tool_call_forced=False,
        response_schema=None,
    )


def _json_output(schema: dict) -> ChatOutput:
    return ChatOutput(
        is_thinking=False,
        is_reasoning_excluded=False,
        tools=None,
        is_tool_call_forced=False,
        response_schema=schema,
    )


def test_auto_tool_call_that_matches_its_schema_is_a_call() -> None:
    out = _auto_output()
    out.feed(_call("Paris"))
    message, reason = out.final_message("stop")
    assert reason == "tool_calls" and message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == '{"city": "Paris"}'


@pytest.mark.parametrize("pieces", [1, 7])
@pytest.mark.parametrize("call", [_call("Berlin"), _call("Paris").replace("get_weather", "rm")])
def test_auto_tool_call_that_is_no_valid_call_is_dropped(pieces: int, call: str) -> None:
    """Berlin is not in the enum; `rm` is no declared tool: neither a call nor raw markup."""
    out = _auto_output()
    text = "Let me look. " + call
    step = -(-len(text) // pieces)
    deltas = [d for i in range(0, len(text), step) for d in out.feed(text[i : i + step])]
    deltas += out.finish()
    assert not any(d.tool_calls for d in deltas)  # never streamed as a call
    assert "".join(d.content or "" for d in deltas) == "Let me look."
    message, reason = out.final_message("stop")
    assert (message.content, message.tool_calls, reason) == ("Let me look.", None, "stop")


def test_json_output_cut_by_the_token_limit_is_length() -> None:
    out = _json_output({"type": "object"})
    out.feed('{"ok": tr')
    message, reason = out.final_message("length")
    assert (message.content, reason) == ('{"ok": tr', "length")


def test_json_output_that_stopped_invalid_is_an_error_not_stop() -> None:
    schema = {"type": "object", "required": ["ok"]}
    valid = _json_output(schema)
    valid.feed('{"ok": true}')
    assert valid.final_message("stop")[1] == "stop"
    for text in ('{"ok": tr', '{"other": 1}'):
        out = _json_output(schema)
        out.feed(text)
        with pytest.raises(InvalidStructuredOutput, match="response_format"):
            out.final_message("stop")


def test_auto_call_cut_short_is_length_and_leaves_no_markup() -> None:
    out = _auto_output()
    text = "Checking.\n" + _call("Paris") + "\n" + _call("Rome")[:40]
    deltas = out.feed(text) + out.finish("length")
    content = "".join(d.content or "" for d in deltas)
    assert content == "Checking."
    assert [c.function.name for c in out.tool_calls] == ["get_weather"]
    assert out.finish_reason("length") == "length"
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert calls and all(c.type == "function" for c in calls)


def test_unclosed_call_in_a_stopped_output_stays_text() -> None:
    out = _auto_output()
    message, reason = _whole(out, "see <tool_call> in the docs", "stop")
    assert (message.content, reason) == ("see <tool_call> in the docs", "stop")


def _whole(out: ChatOutput, text: str, reason: str):
    out.feed(text)
    return out.final_message(reason)
