"""The one output parser's result as Anthropic content blocks, whole or as the event stream.

A stream is `message_start`, then per block `content_block_start`, its deltas (`thinking_delta`
and a closing `signature_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`,
then `message_delta` (stop reason, final usage) and `message_stop`. Blocks come in the order the
model wrote them: thinking, text, tool calls.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel
from sparkinfer.api.chat_output import ChatOutput
from sparkinfer.api.conversation import Turn
from sparkinfer.api.schemas.chat import ChoiceDelta
from sparkinfer.api.schemas.messages import (
    MessageResponse,
    MessagesUsage,
    OutBlock,
    OutTextBlock,
    OutThinkingBlock,
    OutToolUseBlock,
    StopReason,
)


def signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients send it back; it is not checked)."""
    return hashlib.sha256(thinking.encode()).hexdigest()


def stop_reason(turn: Turn) -> tuple[StopReason, str | None]:
    """Anthropic's stop reason and the stop sequence that ended the answer."""
    if turn.finish_reason == "tool_calls":
        return "tool_use", None
    if turn.finish_reason == "length":
        return ("model_context_window_exceeded" if turn.is_context_bound else "max_tokens"), None
    if turn.stop_string is not None:
        return "stop_sequence", turn.stop_string
    return "end_turn", None


def usage(turn: Turn) -> MessagesUsage:
    u = turn.usage
    cached = u.prompt_tokens_details.cached_tokens
    return MessagesUsage(
        input_tokens=u.prompt_tokens - cached,
        output_tokens=u.completion_tokens,
        cache_read_input_tokens=cached,
    )


def content_blocks(out: ChatOutput, *, is_thinking: bool = False) -> list[OutBlock]:
    """The finished answer's blocks: thinking, text, then one tool_use per call. With thinking
    on there is always a thinking block, as in Anthropic's API (empty when the model closed its
    reasoning at once)."""
    blocks: list[OutBlock] = []
    if out.reasoning or is_thinking:
        blocks.append(OutThinkingBlock(thinking=out.reasoning, signature=signature(out.reasoning)))
    if out.content:
        blocks.append(OutTextBlock(text=out.content))
    for call in out.tool_calls:
        args = json.loads(call.function.arguments or "{}")
        blocks.append(OutToolUseBlock(id=call.id, name=call.function.name, input=args))
    return blocks


def message_response(turn: Turn, message_id: str, model: str) -> MessageResponse:
    reason, sequence = stop_reason(turn)
    return MessageResponse(
        id=message_id,
        content=content_blocks(turn.output, is_thinking=turn.prepared.thinking.is_enabled),
        model=model,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage(turn),
    )


def sse_event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One named event (`event: <type>`) as Anthropic's streams send them."""
    data = payload if isinstance(payload, dict) else payload.model_dump(mode="json")
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {text}\n\n".encode()


PING = sse_event({"type": "ping"})
_Kind = Literal["thinking", "text", "tool_use"]


class MessageEvents:
    """Turns output deltas into block events; one instance per streamed message."""

    def __init__(self, *, is_thinking: bool = False) -> None:
        self._index = -1
        self._kind: _Kind | None = None
        self._thinking = ""
        self._is_thinking_due = is_thinking  # thinking on and no thinking block sent yet

    def start(self, message_id: str, model: str, num_prompt_tokens: int) -> bytes:
        message = MessageResponse(
            id=message_id,
            content=[],
            model=model,
            usage=MessagesUsage(input_tokens=num_prompt_tokens, output_tokens=0),
        )
        return sse_event({"type": "message_start", "message": message.model_dump(mode="json")})

    def feed(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if d.reasoning_content or (self._is_thinking_due and (d.content or d.tool_calls)):
                self._open_thinking(out)
            if d.reasoning_content:
                self._thinking += d.reasoning_content
                out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning_content}))
            if d.content:
                self._open("text", {"type": "text", "text": ""}, out)
                out.append(self._delta({"type": "text_delta", "text": d.content}))
            for call in d.tool_calls or []:
                if call.id is not None:
                    name = call.function.name
                    block: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": name}
                    block["input"] = {}
                    self._open("tool_use", block, out, is_new=True)
                args = call.function.arguments
                if args:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        return out

    def finish(self, turn: Turn) -> list[bytes]:
        out: list[bytes] = []
        if self._is_thinking_due:
            self._open_thinking(out)
        self._close(out)
        reason, sequence = stop_reason(turn)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(
            sse_event({"type": "message_delta", "delta": delta, "usage": usage(turn).model_dump()})
        )
        out.append(sse_event({"type": "message_stop"}))
        return out

    def _open_thinking(self, out: list[bytes]) -> None:
        self._is_thinking_due = False
        self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)

    def _open(
        self, kind: _Kind, block: dict[str, Any], out: list[bytes], *, is_new: bool = False
    ) -> None:
        if self._kind == kind and not is_new:
            return
        self._close(out)
        self._index += 1
        self._kind = kind
        out.append(
            sse_event({"type": "content_block_start", "index": self._index, "content_block": block})
        )

    def _close(self, out: list[bytes]) -> None:
        if self._kind is None:
            return
        if self._kind == "thinking":
            sig = {"type": "signature_delta", "signature": signature(self._thinking)}
            out.append(self._delta(sig))
            self._thinking = ""
        out.append(sse_event({"type": "content_block_stop", "index": self._index}))
        self._kind = None

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event({"type": "content_block_delta", "index": self._index, "delta": delta})
