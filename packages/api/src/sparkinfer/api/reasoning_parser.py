"""Split a Qwen output into reasoning (`<think>` … `</think>`) and the answer.

The `qwen3` rule: with thinking on, the prompt already ends in `<think>\\n`, so everything
before the first `</think>` is reasoning; an output that itself opens with `<think>` has that
tag dropped. With thinking off there is no reasoning and the text passes through unchanged.
Whitespace around the reasoning and at the start of the answer is dropped (the model writes
`</think>\\n\\n`; the chat template trims reasoning anyway).

Tool calls inside the thinking: Qwen models sometimes emit `<tool_call>` before closing the
think block. `<tool_call>` is a control token, so it always means a call: reasoning ends there,
the call and everything after go to the content (where the tool-call parser finds them), and
the one `</think>` that may follow is dropped. Callers therefore always run the tool-call
parser over `content` only.

`split_reasoning` runs the streaming state machine over the whole text, so streamed and
whole-text results agree at every split.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sparkinfer.api.stops import partial_tag_len

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: thinking was off
    content: str


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str
    content: str


class _Phase(Enum):
    OPENING = "opening"  # may still see a leading <think>
    REASONING = "reasoning"
    CONTENT = "content"


class StreamingReasoningParser:
    """Feeds text deltas; yields reasoning and content deltas."""

    def __init__(self, *, thinking: bool) -> None:
        self._thinking = thinking
        self._phase = _Phase.OPENING if thinking else _Phase.CONTENT
        self._buffer = ""
        self._pending_ws = ""  # trailing reasoning whitespace: dropped if reasoning ends here
        self._has_reasoning = False  # leading reasoning whitespace is dropped until text comes
        self._strip_content = False  # drop whitespace at the start of the answer
        self._drop_think_end = False  # reasoning ended at <tool_call>: drop one later </think>

    @property
    def is_reasoning(self) -> bool:
        """True while the output is still inside the thinking block."""
        return self._phase is not _Phase.CONTENT

    def feed(self, delta: str) -> ReasoningDelta:
        self._buffer += delta
        return self._drain(is_final=False)

    def finish(self) -> ReasoningDelta:
        """End of output: flush held-back text (an unclosed thinking block stays reasoning)."""
        return self._drain(is_final=True)

    def _drain(self, *, is_final: bool) -> ReasoningDelta:
        reasoning: list[str] = []
        content: list[str] = []
        if self._phase is _Phase.OPENING:
            head = self._buffer.lstrip()
            if head.startswith(THINK_START):
                self._buffer = head[len(THINK_START) :]
            elif not is_final and THINK_START.startswith(head):
                return ReasoningDelta("", "")  # still could be <think>
            self._phase = _Phase.REASONING
        if self._phase is _Phase.REASONING:
            reasoning.append(self._reasoning_part(is_final))
        if self._phase is _Phase.CONTENT:
            content.append(self._content_part(is_final))
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _reasoning_part(self, is_final: bool) -> str:
        tags = (THINK_END, TOOL_CALL_START)
        ends = [(i, tag) for tag in tags if (i := self._buffer.find(tag)) >= 0]
        if not ends:
            keep = 0 if is_final else max(partial_tag_len(self._buffer, t) for t in tags)
            text = self._reasoning_text(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return text
        idx, tag = min(ends)
        text = self._reasoning_text(self._buffer[:idx])
        self._pending_ws = ""
        self._phase = _Phase.CONTENT
        if tag == THINK_END:
            self._buffer = self._buffer[idx + len(THINK_END) :]
            self._strip_content = True
        else:
            self._buffer = self._buffer[idx:]  # the call itself is content
            self._drop_think_end = True
        return text

    def _reasoning_text(self, text: str) -> str:
        if not self._has_reasoning:
            text = text.lstrip()
            if not text:
                return ""
            self._has_reasoning = True
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        return body

    def _content_part(self, is_final: bool) -> str:
        if self._drop_think_end:
            idx = self._buffer.find(THINK_END)
            if idx >= 0:
                self._buffer = self._buffer[:idx] + self._buffer[idx + len(THINK_END) :]
                self._drop_think_end = False
            else:
                keep = 0 if is_final else partial_tag_len(self._buffer, THINK_END)
                text = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return self._content_text(text)
        text, self._buffer = self._buffer, ""
        return self._content_text(text)

    def _content_text(self, text: str) -> str:
        if self._strip_content:
            text = text.lstrip()
            self._strip_content = not text
        return text


def split_reasoning(text: str, *, thinking: bool) -> ReasoningSplit:
    """Split a whole output into reasoning (None with thinking off) and content."""
    parser = StreamingReasoningParser(thinking=thinking)
    first, last = parser.feed(text), parser.finish()
    reasoning = first.reasoning + last.reasoning
    return ReasoningSplit(reasoning if thinking else None, first.content + last.content)
