"""`/v1/responses`: the OpenAI Responses API, with stored conversations.

A thin adapter over the conversation core: the body (after the stored conversation of
`previous_response_id`) becomes the internal conversation (`responses_input`), the answer's
deltas become output items (`responses_output`). With `store` (the default) the response and
its conversation are kept in the `ResponseStore` for `GET`, `DELETE` and follow-ups.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from sparkinfer.api.conversation import Turn, read_body, run_turn, start_turn, turn_steps
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.errors import ApiError, map_exception
from sparkinfer.api.generation import CLIENT_CLOSED_REQUEST, unless_disconnected
from sparkinfer.api.request_ids import request_id
from sparkinfer.api.response_store import ResponseStore
from sparkinfer.api.responses_input import input_items, to_conversation, tool_namespaces
from sparkinfer.api.responses_output import ResponseEvents, finished, output_items
from sparkinfer.api.schemas.responses import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from sparkinfer.api.streaming import SSE_HEADERS, with_keep_alive
from starlette.concurrency import run_in_threadpool

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


class ResponseNotFound(ApiError):
    status = 404
    code = "not_found"


def get_store(request: Request) -> ResponseStore:
    return request.app.state.responses


Store = Annotated[ResponseStore, Depends(get_store)]


def _not_found(response_id: str, param: str | None = None) -> ResponseNotFound:
    return ResponseNotFound(
        f"{param or 'response'} {response_id!r} is not stored (never stored, deleted, or "
        "dropped by the retention limit max_stored_responses): send the whole conversation "
        "as input",
        param=param,
    )


def _base(body: ResponsesRequest, state: ServerState, rid: str) -> ResponseObject:
    """The response before its answer: the request's settings echoed, as OpenAI does."""
    reasoning = None
    if body.reasoning is not None:
        reasoning = {"effort": body.reasoning.effort, "summary": body.reasoning.summary}
    fmt = body.text.format if body.text is not None else None
    return ResponseObject(
        id=rid,
        created_at=now(),
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=state.model_id,
        parallel_tool_calls=body.parallel_tool_calls,
        previous_response_id=body.previous_response_id,
        reasoning=reasoning,
        store=body.store,
        temperature=body.temperature,
        text={
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        tool_choice=_tool_choice(body),
        tools=[t.model_dump(exclude_none=True) for t in body.tools or []],
        top_p=body.top_p,
        user=body.user,
        metadata=body.metadata or {},
    )


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    return choice.model_dump()


@router.post("/v1/responses", response_model=None)
async def create_response(
    request: Request, state: State, store: Store
) -> Response | ResponseObject:
    """Check the body, queue the answer, then stream its events or answer whole (and store)."""
    body = await read_body(request, ResponsesRequest)
    state.check_model(body.model)
    rid = f"resp_{request_id(request)}"
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = await run_in_threadpool(store.items, body.previous_response_id)
        if stored is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        history = stored
    turn = await start_turn(to_conversation(body, history), state, rid)
    logger.info("request %s: %d prompt tokens (responses)", rid, turn.num_prompt_tokens)
    base = _base(body, state, rid)
    conversation = [*history, *input_items(body)]
    if not body.stream:
        whole = await unless_disconnected(request, run_turn(turn))
        if whole is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        items = output_items(whole, tool_namespaces(body))
        response = finished(base, whole, state.tokenizer).model_copy(update={"output": items})
        if body.store:
            await _store(store, response, [*conversation, *items], len(items))
        return response
    builder = ResponseEvents(tool_namespaces(body))
    events = _events(turn, state, base, store if body.store else None, conversation, builder)
    return StreamingResponse(
        with_keep_alive(events, state.settings.keep_alive_s),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def _store(
    store: ResponseStore, response: ResponseObject, items: list[dict[str, Any]], num_output: int
) -> None:
    await run_in_threadpool(store.put, response.model_dump(mode="json"), items, num_output)


async def _events(
    turn: Turn,
    state: ServerState,
    base: ResponseObject,
    store: ResponseStore | None,
    conversation: list[dict[str, Any]],
    builder: ResponseEvents,
) -> AsyncGenerator[bytes, None]:
    """Lifecycle events around the items' events; a failure ends the stream with `error`."""
    steps = turn_steps(turn)
    try:
        yield builder.lifecycle("response.created", base)
        yield builder.lifecycle("response.in_progress", base)
        async for step in steps:
            for event in builder.feed(step.deltas, step.logprobs):
                yield event
        for event in builder.finish(turn):
            yield event
        response = finished(base, turn, state.tokenizer).model_copy(
            update={"output": builder.items}
        )
        if store is not None:
            await _store(store, response, [*conversation, *builder.items], len(builder.items))
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        yield builder.lifecycle(kind, response)
    except Exception as exc:
        error = map_exception(exc, base.id).body["error"]
        yield builder.error(error)
    finally:
        await steps.aclose()


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, store: Store) -> dict[str, Any]:
    found = await run_in_threadpool(store.get, response_id)
    if found is None:
        raise _not_found(response_id)
    return found


@router.get("/v1/responses/{response_id}/input_items")
async def get_input_items(response_id: str, store: Store) -> InputItemList:
    items = await run_in_threadpool(store.input_items, response_id)
    if items is None:
        raise _not_found(response_id)
    ids = [i.get("id") for i in items if isinstance(i.get("id"), str)]
    return InputItemList(
        data=items, first_id=ids[0] if ids else None, last_id=ids[-1] if ids else None
    )


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, store: Store) -> DeletedResponse:
    if not await run_in_threadpool(store.delete, response_id):
        raise _not_found(response_id)
    return DeletedResponse(id=response_id)
