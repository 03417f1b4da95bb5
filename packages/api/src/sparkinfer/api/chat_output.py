"""One chat choice's output: reasoning split off, tool calls parsed out, streamed as deltas.

`reasoning_parser` splits `reasoning</think>answer`; `tool_parser` takes Qwen XML calls out of
the answer. When the call is forced (tool_choice required or named) the whole answer is held to
the end and every call is checked against its schema: if any fails, the text is returned as
content and no call is reported, so prose is never passed off as a tool call. Under
tool_choice auto each call is checked as it completes; a block that is no valid call of a
declared tool is dropped (call markup never comes back as text). JSON output (response_format)
is checked against its schema at the end: content that fails is reported as `length` when the
token limit cut it, and is an error otherwise (the grammar should have made that impossible),
never a plain `stop`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema
from sparkinfer.api.errors import InternalError
from sparkinfer.api.reasoning_parser import THINK_END, ReasoningDelta, StreamingReasoningParser
from sparkinfer.api.schemas.chat import (
    ChoiceDelta,
    DeltaToolCall,
    DeltaToolCallFunction,
    ResponseMessage,
    ResponseToolCall,
    ToolCallFunction,
)
from sparkinfer.api.schemas.common import TokenLogprobEntry, TopLogprob
from sparkinfer.api.tool_parser import (
    TOOL_CALL_END,
    TOOL_CALL_START,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
)
from sparkinfer.api.tools import ToolSet, validator_for
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import TokenLogprob


class InvalidStructuredOutput(InternalError):
    """A choice stopped with JSON content that does not match its response_format schema."""


def _delta_call(d: ToolCallDelta) -> DeltaToolCall:
    fn = DeltaToolCallFunction(name=d.name, arguments=d.arguments)
    # Every delta says "function": the openai SDK's stream helper drops a call otherwise.
    return DeltaToolCall(index=d.index, id=d.id, type="function", function=fn)


def _response_call(c: ToolCall) -> ResponseToolCall:
    return ResponseToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))


class ChatOutput:
    """Turns one choice's text deltas into reasoning / content / tool-call deltas."""

    def __init__(
        self,
        *,
        is_thinking: bool,
        is_reasoning_excluded: bool,
        tools: ToolSet | None,
        is_tool_call_forced: bool,
        response_schema: dict[str, Any] | bool | None,
    ) -> None:
        self._reasoning_parser = StreamingReasoningParser(thinking=is_thinking)
        self._tools = tools
        self._call_parser = ToolCallParser(tools) if tools is not None else None
        # Under auto the grammar holds an opened call to the declared tools; a block that still
        # is no valid call (the grammar could not be applied) is dropped, never raw markup.
        self._call_stream = (
            ToolCallParser(
                tools, check_arguments=tools.check_arguments, is_invalid_dropped=True
            ).stream()
            if tools is not None
            else None
        )
        self._is_forced = is_tool_call_forced and tools is not None
        self._is_excluded = is_reasoning_excluded
        self._schema = response_schema
        self._held = ""  # the whole answer of a forced call, checked at the end
        self._is_finished = False
        self._is_truncated = False  # cut short by the token limit
        self.reasoning = ""
        self.content = ""
        self.tool_calls: list[ResponseToolCall] = []

    def feed(self, text: str) -> list[ChoiceDelta]:
        """New text → the deltas that are certain now."""
        return self._emit(self._reasoning_parser.feed(text), is_final=False)

    def finish(self, engine_reason: str | None = None) -> list[ChoiceDelta]:
        """End of the choice: flush held text and resolve the tool calls (idempotent).

        engine_reason "length": the output was cut short, so a call it left open is dropped
        rather than returned as text (its markup never reaches the content)."""
        if self._is_finished:
            return []
        self._is_finished = True
        self._is_truncated = engine_reason == "length"
        return self._emit(self._reasoning_parser.finish(), is_final=True)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """The OpenAI finish reason; InvalidStructuredOutput for JSON that stopped invalid.

        Cut short, it is `length` even after complete calls: the calls asked for may not all
        be there."""
        if engine_reason == "length":
            return "length"
        if self.tool_calls:
            return "tool_calls"
        if engine_reason == "stop" and not self.content_matches_schema():
            raise InvalidStructuredOutput(
                f"the output stopped with content that is not JSON matching response_format "
                f"({len(self.content)} characters); the request id is in the server log"
            )
        return engine_reason

    def final_message(self, engine_reason: str | None) -> tuple[ResponseMessage, str | None]:
        """The whole message (non-streaming) and its finish reason."""
        self.finish(engine_reason)
        return self.message(), self.finish_reason(engine_reason)

    def message(self) -> ResponseMessage:
        """The message as parsed so far (whole once `finish` was called)."""
        reasoning = None if self._is_excluded or not self.reasoning else self.reasoning
        return ResponseMessage(
            content=self.content or (None if self.tool_calls else ""),
            reasoning_content=reasoning,
            reasoning=reasoning,
            tool_calls=self.tool_calls or None,
        )

    def content_matches_schema(self) -> bool:
        """True when there is no response schema, or the content is JSON that matches it."""
        if self._schema is None:
            return True
        try:
            # jsonschema's stubs leave validate's legacy overload untyped.
            validator_for(self._schema).validate(json.loads(self.content))  # pyright: ignore[reportUnknownMemberType]
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False
        return True

    def _emit(self, r: ReasoningDelta, *, is_final: bool) -> list[ChoiceDelta]:
        out: list[ChoiceDelta] = []
        if r.reasoning:
            self.reasoning += r.reasoning
            if not self._is_excluded:
                out.append(ChoiceDelta(reasoning_content=r.reasoning, reasoning=r.reasoning))
        if self._is_forced:
            self._held += r.content
            if is_final:
                self._resolve_forced(out)
            return out
        if self._call_stream is None:
            self._add_content(r.content, out)
            return out
        parts = [self._call_stream.feed(r.content)]
        if is_final:
            parts.append(self._call_stream.finish(is_truncated=self._is_truncated))
        for part in parts:
            self._add_content(part.content, out)
            if part.calls:
                out.append(ChoiceDelta(tool_calls=[_delta_call(d) for d in part.calls]))
        if is_final:
            self.tool_calls = [_response_call(c) for c in self._call_stream.calls]
        return out

    def _add_content(self, text: str, out: list[ChoiceDelta]) -> None:
        if text:
            self.content += text
            out.append(ChoiceDelta(content=text))

    def _resolve_forced(self, out: list[ChoiceDelta]) -> None:
        assert self._call_parser is not None and self._tools is not None
        if self._is_truncated:  # a call left open is a call's beginning: drop it
            start = self._held.rfind(TOOL_CALL_START)
            if start > self._held.rfind(TOOL_CALL_END):
                self._held = self._held[:start]
        parsed = self._call_parser.parse(self._held)
        calls = parsed.calls
        is_valid = bool(calls) and all(
            self._tools.check_arguments(c.name, c.arguments) is None for c in calls
        )
        if not is_valid:
            self._add_content(self._held, out)
            return
        self._add_content(parsed.content, out)
        self.tool_calls = [_response_call(c) for c in calls]
        deltas = [
            d
            for i, c in enumerate(calls)
            for d in (ToolCallDelta(i, c.id, c.name, ""), ToolCallDelta(i, None, None, c.arguments))
        ]
        out.append(ChoiceDelta(tool_calls=[_delta_call(d) for d in deltas]))


class ReasoningTokenCounter:
    """Counts one choice's reasoning tokens: with thinking on, those up to its `</think>` (a
    tokenizer without that token: the reasoning text re-encoded)."""

    def __init__(self, tokenizer: Tokenizer, *, is_thinking: bool) -> None:
        self._tokenizer = tokenizer
        self._is_thinking = is_thinking
        self._end_id = tokenizer.token_to_id(THINK_END) if is_thinking else None
        self._is_open = self._end_id is not None
        self._count = 0

    def push(self, token_ids: Sequence[int]) -> None:
        if not self._is_open:
            return
        for token_id in token_ids:
            self._count += 1
            if token_id == self._end_id:
                self._is_open = False
                return

    def count(self, reasoning: str) -> int:
        """The choice's reasoning tokens; `reasoning` is its reasoning text."""
        if self._is_thinking and self._end_id is None:
            return len(self._tokenizer.encode(reasoning))
        return self._count


def to_chat_logprobs(
    tokenizer: Tokenizer, entries: Sequence[TokenLogprob]
) -> list[TokenLogprobEntry]:
    """Engine logprobs → the chat `logprobs.content` entries."""
    out: list[TokenLogprobEntry] = []
    for entry in entries:
        raw = tokenizer.token_bytes(entry.token_id)
        top = [
            TopLogprob(
                token=tokenizer.decode([t]), logprob=lp, bytes=list(tokenizer.token_bytes(t))
            )
            for t, lp in entry.top
        ]
        out.append(
            TokenLogprobEntry(
                token=tokenizer.decode([entry.token_id]),
                logprob=entry.logprob,
                bytes=list(raw),
                top_logprobs=top,
            )
        )
    return out
