"""Anthropic bodies → the internal conversation: system, blocks, tool results, thinking."""

from __future__ import annotations

import pytest
from sparkinfer.api.errors import InvalidMedia, InvalidRequest
from sparkinfer.api.messages_input import to_conversation
from sparkinfer.api.schemas.messages import MessagesRequest


def _req(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 16, **fields})


def test_blocks_map_to_chat_messages() -> None:
    conv = to_conversation(
        _req(
            system=[{"type": "text", "text": "Be brief."}],
            messages=[
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Rome"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "18 C"},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
            tools=[{"name": "w", "input_schema": {"type": "object"}}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            thinking={"type": "enabled", "budget_tokens": 8},
            stop_sequences=["END"],
        )
    )
    req = conv.request
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    assistant = req.messages[2]
    assert assistant.reasoning_content == "Use the tool."
    assert assistant.tool_calls is not None and assistant.tool_calls[0].function.arguments == {
        "city": "Rome"
    }
    assert req.messages[3].tool_call_id == "t1" and req.messages[3].content == "18 C"
    assert (req.tool_choice, req.parallel_tool_calls) == ("required", False)
    assert req.enable_thinking and req.reasoning is not None and req.reasoning.max_tokens == 8
    assert req.stop_strings == ["END"] and req.max_tokens == 16
    assert ("messages[4]", "messages[2]") in conv.paths


def test_thinking_is_off_unless_asked() -> None:
    req = to_conversation(_req(messages=[{"role": "user", "content": "Hi"}])).request
    assert req.enable_thinking is False
    req = to_conversation(
        _req(messages=[{"role": "user", "content": "Hi"}], thinking={"type": "adaptive"})
    ).request
    assert req.enable_thinking is True


def test_images_become_data_urls_and_url_sources_are_refused() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    req = to_conversation(_req(messages=[{"role": "user", "content": [image]}])).request
    content = req.messages[0].content
    assert isinstance(content, list) and content[0].type == "image_url"
    url = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    with pytest.raises(InvalidMedia) as err:
        to_conversation(_req(messages=[{"role": "user", "content": [url]}]))
    assert err.value.param == "messages[0].content[0].source"


def test_server_tools_are_refused_and_a_final_assistant_turn_is_a_prefill() -> None:
    user = [{"role": "user", "content": "Hi"}]
    with pytest.raises(InvalidRequest, match=r"tools\[0\]\.type"):
        to_conversation(_req(messages=user, tools=[{"type": "web_search_20250305", "name": "s"}]))
    prefilled = to_conversation(_req(messages=[*user, {"role": "assistant", "content": "Sure"}]))
    assert prefilled.request.continue_final_message
    assert not to_conversation(_req(messages=user)).request.continue_final_message
