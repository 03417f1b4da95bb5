"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic Messages API.

A thin adapter over the conversation core: the body becomes the internal conversation
(`messages_input`), the answer's deltas become Anthropic blocks (`messages_output`), and errors
take Anthropic's shape (`anthropic_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from sparkinfer.api.anthropic_errors import anthropic_sse_error
from sparkinfer.api.conversation import (
    Turn,
    count_prompt_tokens,
    run_turn,
    start_turn,
    turn_steps,
)
from sparkinfer.api.conversation_value import parse_body
from sparkinfer.api.dependencies import State
from sparkinfer.api.edge import client_id
from sparkinfer.api.generation import CLIENT_CLOSED_REQUEST, unless_disconnected
from sparkinfer.api.messages_input import to_conversation
from sparkinfer.api.messages_output import PING, MessageEvents, message_response
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import request_id
from sparkinfer.api.schemas.messages import (
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from sparkinfer.api.streaming import KEEP_ALIVE, SSE_HEADERS, with_keep_alive

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


@router.post(
    "/v1/messages",
    response_model=None,
    responses={200: {"model": MessageResponse, "description": "The message, or its events"}},
)
async def create_message(
    body: Annotated[MessagesRequest, Depends(JsonBody(MessagesRequest, validate=parse_body))],
    request: Request,
    state: State,
) -> Response | MessageResponse:
    """Check and render the conversation, queue it, then stream the events or answer whole."""
    state.check_model(body.model)
    rid = f"msg_{request_id(request)}"
    turn = await start_turn(to_conversation(body), state, rid, client=client_id(request.scope))
    logger.info("request %s: %d prompt tokens (messages)", rid, turn.num_prompt_tokens)
    if not body.stream:
        whole = await unless_disconnected(request, run_turn(turn))
        if whole is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return message_response(whole, rid, state.model_id)
    events = _events(turn, rid, state.model_id)
    return StreamingResponse(
        _with_pings(events, state.config.requests.keep_alive_s),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    body: Annotated[CountTokensRequest, Depends(JsonBody(CountTokensRequest, validate=parse_body))],
    state: State,
) -> CountTokensResponse:
    """The prompt length the same body would have, media expanded; nothing is queued."""
    state.check_model(body.model)
    return CountTokensResponse(input_tokens=await count_prompt_tokens(to_conversation(body), state))


async def _events(turn: Turn, rid: str, model: str) -> AsyncGenerator[bytes, None]:
    """message_start, the blocks' events, message_delta and message_stop (or an error event)."""
    builder = MessageEvents(is_thinking=turn.prepared.thinking.is_enabled)
    steps = turn_steps(turn)
    try:
        yield builder.start(rid, model, turn.num_prompt_tokens)
        async for step in steps:
            for event in builder.feed(step.deltas):
                yield event
        for event in builder.finish(turn):
            yield event
    except Exception as exc:
        yield anthropic_sse_error(exc, rid)
    finally:
        await steps.aclose()


async def _with_pings(
    events: AsyncGenerator[bytes, None], keep_alive_s: float
) -> AsyncIterator[bytes]:
    """`events`, with a `ping` event whenever none came for `keep_alive_s` (a long prefill)."""
    async for event in with_keep_alive(events, keep_alive_s):
        yield PING if event == KEEP_ALIVE else event
