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
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "user"]
    assistant = conv.messages[2]
    assert assistant.reasoning_content == "Use the tool."
    assert assistant.tool_calls is not None and assistant.tool_calls[0].function.arguments == {
        "city": "Rome"
    }
    assert conv.messages[3].tool_call_id == "t1" and conv.messages[3].content == "18 C"
    assert (conv.tool_choice, conv.is_parallel_tool_calls) == ("required", False)
    assert conv.thinking.is_enabled and conv.thinking.budget == 8
    assert conv.sampling.stop_strings == ("END",) and conv.limits.max_tokens == 16
    assert ("messages[4]", "messages[2]") in conv.paths


def test_thinking_is_off_unless_asked() -> None:
    conv = to_conversation(_req(messages=[{"role": "user", "content": "Hi"}]))
    assert conv.thinking.is_enabled is False
    conv = to_conversation(
        _req(messages=[{"role": "user", "content": "Hi"}], thinking={"type": "adaptive"})
    )
    assert conv.thinking.is_enabled is True


def test_images_become_data_urls_and_url_sources_are_refused() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    conv = to_conversation(_req(messages=[{"role": "user", "content": [image]}]))
    content = conv.messages[0].content
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
    assert prefilled.is_continued
    assert not to_conversation(_req(messages=user)).is_continued
