"""Responses items and events from output deltas, read back by the `openai` SDK's stream state."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from sparkinfer.api.responses_output import ResponseEvents, finished
from sparkinfer.api.schemas.chat import ChoiceDelta, DeltaToolCall, DeltaToolCallFunction
from sparkinfer.api.schemas.common import PromptTokensDetails, Usage
from sparkinfer.api.schemas.responses import ResponseObject


def _turn(finish_reason: str) -> Any:
    usage = Usage(
        prompt_tokens=10, completion_tokens=7, total_tokens=17,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=4),
    )  # fmt: skip
    counter = SimpleNamespace(count=lambda text: 3)
    output = SimpleNamespace(reasoning="Hmm.")
    return SimpleNamespace(
        usage=usage, finish_reason=finish_reason, reasoning_tokens=counter, output=output
    )


def _call(call_id: str | None, name: str | None, args: str) -> ChoiceDelta:
    fn = DeltaToolCallFunction(name=name, arguments=args)
    return ChoiceDelta(tool_calls=[DeltaToolCall(index=0, id=call_id, function=fn)])


def _run(deltas: list[list[ChoiceDelta]], finish_reason: str) -> list[dict[str, Any]]:
    builder = ResponseEvents()
    base = ResponseObject(id="resp_1", created_at=1, status="in_progress", model="m")
    events = [builder.lifecycle("response.created", base)]
    for step in deltas:
        events += builder.feed(step)
    turn = _turn(finish_reason)
    events += builder.finish(turn)
    final = finished(base, turn, None).model_copy(update={"output": builder.items})  # type: ignore[arg-type]
    kind = "response.completed" if final.status == "completed" else "response.incomplete"
    events.append(builder.lifecycle(kind, final))
    payloads = []
    for raw in events:
        name, data = raw.decode().strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        payloads.append(payload)
    return payloads


def test_events_accumulate_to_reasoning_message_and_call() -> None:
    payloads = _run(
        [
            [ChoiceDelta(reasoning_content="Hm"), ChoiceDelta(reasoning_content="m.")],
            [ChoiceDelta(content="Checking.")],
            [_call("call_a", "get_weather", ""), _call(None, None, '{"city": "Paris"}')],
        ],
        "tool_calls",
    )
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=omit)
    for p in payloads:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=p))  # type: ignore[arg-type]
    response = state._completed_response
    assert response is not None and response.status == "completed"
    reasoning, message, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Hmm."  # type: ignore[union-attr,index]
    assert message.type == "message" and response.output_text == "Checking."
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 3


def test_a_cut_answer_is_incomplete() -> None:
    payloads = _run([[ChoiceDelta(content="Once upon")]], "length")
    last = payloads[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"


def test_a_namespaced_call_names_its_namespace() -> None:
    builder = ResponseEvents(frozenset({"agents"}))
    builder.feed([_call("call_a", "agents.close", '{"id": 1}')])
    builder.finish(_turn("tool_calls"))
    (item,) = builder.items
    assert (item["namespace"], item["name"], item["arguments"]) == ("agents", "close", '{"id": 1}')
