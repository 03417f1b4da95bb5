"""Reasoning split (`qwen3` rule): whole text, streaming at every split, calls inside thinking."""

from __future__ import annotations

import itertools
import random

import pytest
from sparkinfer.api.reasoning_parser import (
    ReasoningSplit,
    StreamingReasoningParser,
    split_reasoning,
)
from sparkinfer.api.tool_parser import ToolCallParser

CALL = "<tool_call>\n<function=ping>\n</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("Let me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4."),
        ("<think>\nOpened again.\n</think>\n\nAnswer", "Opened again.", "Answer"),
        ("  \n<think>x</think>y", "x", "y"),
        ("</think>\n\nNo thoughts.", "", "No thoughts."),
        ("Still thinking when cut off ", "Still thinking when cut off", ""),
        ("a</think>b</think>c", "a", "b</think>c"),
        ("1 < 2 and </thin is not a tag</think>ok", "1 < 2 and </thin is not a tag", "ok"),
        ("<thinking is not the tag</think>ok", "<thinking is not the tag", "ok"),
        ("", "", ""),
    ],
)
def test_thinking_on(text: str, reasoning: str, content: str) -> None:
    assert split_reasoning(text, thinking=True) == ReasoningSplit(reasoning, content)


def test_thinking_off_passes_text_through() -> None:
    text = "\n\nplain <think>not parsed</think> answer "
    assert split_reasoning(text, thinking=False) == ReasoningSplit(None, text)


def test_tool_call_inside_thinking_ends_reasoning() -> None:
    text = f"I should ping.\n\n{CALL}\n</think>\n\n"
    split = split_reasoning(text, thinking=True)
    assert split.reasoning == "I should ping."
    assert split.content == f"{CALL}\n\n\n"
    parsed = ToolCallParser([{"type": "function", "function": {"name": "ping"}}]).parse(
        split.content
    )
    assert parsed.content == "" and [c.name for c in parsed.calls] == ["ping"]


def test_tool_call_after_thinking_is_content() -> None:
    split = split_reasoning(f"plan</think>\n\nCalling.\n\n{CALL}", thinking=True)
    assert split == ReasoningSplit("plan", f"Calling.\n\n{CALL}")


CASES = [
    "<think>\nStep 1.\n\nStep 2.  \n</think>\n\nFinal </think> answer.\n",
    "Short</think>Answer with <think> inside",
    f"Need a tool.\n{CALL}\n</think>\n\nafter",
    "never closed </thi",
    "\n\n  <thi",
    "<think>",
]


def stream(chunks: list[str], *, thinking: bool = True) -> ReasoningSplit:
    parser = StreamingReasoningParser(thinking=thinking)
    deltas = [*(parser.feed(c) for c in chunks), parser.finish()]
    reasoning = "".join(d.reasoning for d in deltas)
    return ReasoningSplit(reasoning if thinking else None, "".join(d.content for d in deltas))


@pytest.mark.parametrize("text", CASES)
def test_streaming_equals_whole_text_at_every_split(text: str) -> None:
    for thinking in (True, False):
        expected = split_reasoning(text, thinking=thinking)
        for cut in range(len(text) + 1):
            assert stream([text[:cut], text[cut:]], thinking=thinking) == expected, cut
        assert stream(list(text), thinking=thinking) == expected
        rng = random.Random(1)
        for _ in range(10):
            cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text))))
            chunks = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
            assert stream(chunks, thinking=thinking) == expected


def test_streaming_holds_back_only_possible_tags() -> None:
    parser = StreamingReasoningParser(thinking=True)
    assert parser.feed("<thi").reasoning == ""
    assert parser.feed("nk>\nidea </th").reasoning == "idea"
    assert parser.is_reasoning
    delta = parser.feed("ink>\n\nanswer")
    assert (delta.reasoning, delta.content) == ("", "answer")
    assert not parser.is_reasoning
    assert parser.finish().content == ""
