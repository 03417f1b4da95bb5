"""`/v1/responses`: the OpenAI Responses API, with stored conversations.

A thin adapter over the conversation core: the body (after the stored conversation of
`previous_response_id`) becomes the internal conversation (`responses_input`), the answer's
deltas become output items (`responses_output`). With `store` (the default) the response and
its conversation are kept in the `ResponseStore` for `GET`, `DELETE` and follow-ups.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from sparkinfer.api.conversation import Turn, run_turn, start_turn, turn_steps
from sparkinfer.api.conversation_value import parse_body
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.edge import client_id, key_owner
from sparkinfer.api.errors import ApiError, InvalidRequest, map_exception
from sparkinfer.api.generation import CLIENT_CLOSED_REQUEST, unless_disconnected
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import request_id
from sparkinfer.api.response_store import (
    BrokenConversation,
    ResponseStore,
    StoredResponseTooLarge,
)
from sparkinfer.api.responses_input import input_items, to_conversation, tool_namespaces
from sparkinfer.api.responses_output import ResponseEvents, finished, output_items
from sparkinfer.api.schemas.responses import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from sparkinfer.api.stored_items import stored_items
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


SHOWN_ID_CHARS = 64  # an id in a message is cut to this many characters


def _shown(response_id: str) -> str:
    cut = response_id[:SHOWN_ID_CHARS]
    return repr(cut) + ("..." if len(response_id) > SHOWN_ID_CHARS else "")


def _not_found(response_id: str, param: str | None = None) -> ResponseNotFound:
    return ResponseNotFound(
        f"{param or 'response'} {_shown(response_id)} is not stored for this API key (never "
        "stored, deleted, or dropped by the retention limits max_stored_responses and "
        "max_stored_bytes): send the whole conversation as input",
        param=param,
    )


async def _history(store: ResponseStore, owner: str, previous_id: str) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` continues; 404 when it is gone."""
    try:
        stored = await run_in_threadpool(store.items, owner, previous_id)
    except BrokenConversation as exc:
        raise ResponseNotFound(
            f"previous_response_id {_shown(previous_id)} continues response "
            f"{_shown(exc.missing_id)}, which is no longer stored (deleted or dropped by the "
            "retention limits): send the whole conversation as input",
            param="previous_response_id",
        ) from None
    if stored is None:
        raise _not_found(previous_id, "previous_response_id")
    return stored


def _storable_items(body: ResponsesRequest, store: ResponseStore) -> list[dict[str, Any]]:
    """The input items as stored; 400 before the answer runs when they alone are over the
    stored response budget."""
    items = stored_items(input_items(body))
    limit = store.limits.max_response_bytes
    num_bytes = len(json.dumps(items).encode())
    if num_bytes > limit:
        raise InvalidRequest(
            f"input takes {num_bytes} bytes to store; max_stored_response_bytes is {limit}: "
            "send store false, or less input",
            param="input",
        )
    return items


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


@router.post(
    "/v1/responses",
    response_model=None,
    responses={200: {"model": ResponseObject, "description": "The response, or its events"}},
)
async def create_response(
    body: Annotated[ResponsesRequest, Depends(JsonBody(ResponsesRequest, validate=parse_body))],
    request: Request,
    state: State,
    store: Store,
) -> Response | ResponseObject:
    """Check the body, queue the answer, then stream its events or answer whole (and store)."""
    state.check_model(body.model)
    rid = f"resp_{secrets.token_hex(24)}"  # made here, never from the client
    owner = key_owner(request.scope)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        history = await _history(store, owner, body.previous_response_id)
    conversation = to_conversation(body, history)
    is_stored = body.store and store.limits.max_responses > 0
    new_items: list[dict[str, Any]] = []
    if is_stored:  # sizing megabytes of input is CPU work: off the event loop
        new_items = await run_in_threadpool(_storable_items, body, store)
    turn = await start_turn(conversation, state, rid, client=client_id(request.scope))
    logger.info(
        "request %s: %s, %d prompt tokens (responses)",
        request_id(request), rid, turn.num_prompt_tokens,
    )  # fmt: skip
    base = _base(body, state, rid)
    saver = _Saver(store, owner, new_items) if is_stored else None
    if not body.stream:
        whole = await unless_disconnected(request, run_turn(turn))
        if whole is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        items = output_items(whole, tool_namespaces(body))
        response = finished(base, whole, state.tokenizer).model_copy(update={"output": items})
        return response if saver is None else await saver.save(response)
    builder = ResponseEvents(tool_namespaces(body))
    events = _events(turn, state, base, saver, builder)
    return StreamingResponse(
        with_keep_alive(events, state.config.requests.keep_alive_s),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


class _Saver:
    """Stores a finished response; a failed write leaves the answer whole, marked not stored."""

    def __init__(self, store: ResponseStore, owner: str, new_items: list[dict[str, Any]]) -> None:
        self.store = store
        self.owner = owner
        self.new_items = new_items

    async def save(self, response: ResponseObject) -> ResponseObject:
        """`response` as stored; on a failed write, with `store` false and the failure as its
        `error` (the answer is the client's either way)."""
        items = [*self.new_items, *response.output]
        row = response.model_dump(mode="json")
        try:
            await run_in_threadpool(self.store.put, self.owner, row, items, len(response.output))
        except (sqlite3.Error, StoredResponseTooLarge) as exc:
            logger.warning("response %s was not stored: %s", response.id, exc)
            error = {
                "code": "server_error",
                "message": f"the response was not stored ({exc}): it cannot be retrieved or "
                "continued with previous_response_id; send the whole conversation as input",
            }
            return response.model_copy(update={"store": False, "error": error})
        return response


async def _events(
    turn: Turn,
    state: ServerState,
    base: ResponseObject,
    saver: _Saver | None,
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
        if saver is not None:
            response = await saver.save(response)
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        yield builder.lifecycle(kind, response)
    except Exception as exc:
        error = map_exception(exc, base.id).body["error"]
        yield builder.error(error)
    finally:
        await steps.aclose()


@router.get("/v1/responses/{response_id}", responses={200: {"model": ResponseObject}})
async def get_response(request: Request, response_id: str, store: Store) -> dict[str, Any]:
    found = await run_in_threadpool(store.get, key_owner(request.scope), response_id)
    if found is None:
        raise _not_found(response_id)
    return found


@router.get("/v1/responses/{response_id}/input_items")
async def get_input_items(request: Request, response_id: str, store: Store) -> InputItemList:
    try:
        items = await run_in_threadpool(store.input_items, key_owner(request.scope), response_id)
    except BrokenConversation:
        items = None
    if items is None:
        raise _not_found(response_id)
    ids = [i.get("id") for i in items if isinstance(i.get("id"), str)]
    return InputItemList(
        data=items, first_id=ids[0] if ids else None, last_id=ids[-1] if ids else None
    )


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str, store: Store) -> DeletedResponse:
    if not await run_in_threadpool(store.delete, key_owner(request.scope), response_id):
        raise _not_found(response_id)
    return DeletedResponse(id=response_id)
