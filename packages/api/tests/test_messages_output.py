"""Anthropic blocks and events from output deltas, read back by the `anthropic` SDK's own
stream accumulator."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from anthropic._models import construct_type
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from sparkinfer.api.messages_output import MessageEvents, signature, stop_reason
from sparkinfer.api.schemas.chat import ChoiceDelta, DeltaToolCall, DeltaToolCallFunction
from sparkinfer.api.schemas.common import PromptTokensDetails, Usage


def _turn(**fields: Any) -> Any:
    usage = Usage(
        prompt_tokens=10, completion_tokens=7, total_tokens=17,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=4),
    )  # fmt: skip
    base = {"finish_reason": "stop", "stop_string": None, "is_context_bound": False}
    return SimpleNamespace(usage=usage, **{**base, **fields})


def _call(index: int, call_id: str | None, name: str | None, args: str) -> ChoiceDelta:
    fn = DeltaToolCallFunction(name=name, arguments=args)
    return ChoiceDelta(tool_calls=[DeltaToolCall(index=index, id=call_id, function=fn)])


def _parse(events: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for raw in events:
        name, data = raw.decode().strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        out.append(payload)
    return out


def test_events_accumulate_to_thinking_text_and_tool_use() -> None:
    builder = MessageEvents()
    events = [builder.start("msg_1", "m", 10)]
    events += builder.feed(
        [ChoiceDelta(reasoning_content="Let me "), ChoiceDelta(reasoning_content="see.")]
    )
    events += builder.feed([ChoiceDelta(content="Calling.")])
    events += builder.feed(
        [_call(0, "call_a", "get_weather", ""), _call(0, None, None, '{"city": ')]
    )
    events += builder.feed([_call(0, None, None, '"Paris"}')])
    events += builder.finish(_turn(finish_reason="tool_calls"))
    payloads = _parse(events)
    kinds = [p["type"] for p in payloads]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert [p["index"] for p in payloads if p["type"] == "content_block_start"] == [0, 1, 2]
    snapshot = None
    bufs: dict[int, bytes] = {}
    for p in payloads:
        event = construct_type(type_=RawMessageStreamEvent, value=p)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    thinking, text, tool = snapshot.content
    assert thinking.type == "thinking" and thinking.thinking == "Let me see."
    assert thinking.signature == signature("Let me see.")
    assert text.type == "text" and text.text == "Calling."
    assert tool.type == "tool_use" and tool.input == {"city": "Paris"}
    assert snapshot.stop_reason == "tool_use"
    assert (snapshot.usage.input_tokens, snapshot.usage.cache_read_input_tokens) == (6, 4)


def test_each_call_is_its_own_block() -> None:
    builder = MessageEvents()
    builder.start("msg_1", "m", 1)
    events = builder.feed([_call(0, "a", "f", "{}"), _call(1, "b", "f", "{}")])
    starts = [p for p in _parse(events) if p["type"] == "content_block_start"]
    assert [s["content_block"]["id"] for s in starts] == ["a", "b"]


def test_stop_reasons() -> None:
    assert stop_reason(_turn()) == ("end_turn", None)
    assert stop_reason(_turn(stop_string="END")) == ("stop_sequence", "END")
    assert stop_reason(_turn(finish_reason="length")) == ("max_tokens", None)
    bound = _turn(finish_reason="length", is_context_bound=True)
    assert stop_reason(bound) == ("model_context_window_exceeded", None)
