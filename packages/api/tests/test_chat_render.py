"""The shared render rules: system messages anywhere, assistant prefill, client indices."""

from __future__ import annotations

import pytest
from sparkinfer.api.chat_render import place_system_messages, render_chat
from sparkinfer.model.chat_template import ChatOptions, ChatTemplate, ChatTemplateError
from sparkinfer.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.builtin(Tokenizer.embedded())


def test_leading_system_messages_merge_and_later_ones_are_user_turns() -> None:
    messages = [
        {"role": "system", "content": "A"},
        {"role": "developer", "content": [{"type": "text", "text": "B"}]},
        {"role": "user", "content": "Hi"},
        {"role": "developer", "content": "C"},
    ]
    placed, origin = place_system_messages(messages)
    assert [(m["role"], m["content"]) for m in placed] == [
        ("system", "A\n\nB"), ("user", "Hi"), ("user", "C")
    ]  # fmt: skip
    assert origin == [0, 2, 3]


def test_a_continued_message_leaves_the_prompt_open(template: ChatTemplate) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "def f("}]
    options = ChatOptions(enable_thinking=False)
    text = render_chat(template, messages, tools=None, options=options, is_continued=True).text
    assert text.endswith("<think>\n\n</think>\n\ndef f(")
    closed = render_chat(template, messages, tools=None, options=options).text
    assert closed.startswith(text) and "def f(<|im_end|>" in closed


def test_template_errors_name_the_client_index(template: ChatTemplate) -> None:
    messages = [
        {"role": "system", "content": "A"},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": [{"type": "audio"}]},
    ]
    with pytest.raises(ChatTemplateError, match=r"messages\[3\]\.content\[0\]") as err:
        render_chat(template, messages, tools=None, options=ChatOptions())
    assert err.value.param == "messages[3].content[0]"


def test_a_message_without_content_is_placed_too() -> None:
    """Found by the OpenAPI fuzz pass: a leading system message with no content."""
    placed, origin = place_system_messages(
        [{"role": "system"}, {"role": "system", "content": "B"}, {"role": "user"}]
    )
    assert [(m["role"], m.get("content")) for m in placed] == [("system", "B"), ("user", None)]
    assert origin == [0, 2]
