"""`POST /v1/chat/completions`: the chat-completions adapter over the conversation core.

The body becomes the frozen `Conversation` once, at the top of the route; the core checks,
renders and queues its `n` answers, and this module only turns their steps into the chat
shapes: the whole response, or its chunks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sparkinfer.api.conversation import Turn, answer_steps, start_turns
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.edge import client_id
from sparkinfer.api.generation import CLIENT_CLOSED_REQUEST, unless_disconnected
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import request_id
from sparkinfer.api.schemas.chat import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceDelta,
    ChunkChoice,
)
from sparkinfer.api.schemas.common import ChatLogprobs, Usage
from sparkinfer.api.streaming import sse_data, sse_response
from sparkinfer.api.usage import make_timings, make_usage

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletionResponse, "description": "The answer, or its chunks"}},
)
async def create_chat_completion(
    body: Annotated[ChatCompletionRequest, Depends(JsonBody(ChatCompletionRequest))],
    request: Request,
    state: State,
) -> Response | ChatCompletionResponse:
    """Check and render the messages, queue the choices, then stream them or answer whole."""
    state.check_model(body.model)
    rid = f"chatcmpl-{request_id(request)}"
    turns = await start_turns(Conversation.of(body), state, rid, client=client_id(request.scope))
    prep = turns[0].prepared
    num_media = len(prep.multimodal.kinds) if prep.multimodal is not None else 0
    logger.info(
        "request %s: %d prompt tokens (%d media parts), %d choices",
        rid, turns[0].num_prompt_tokens, num_media, len(turns),
    )  # fmt: skip
    if not body.stream:
        async with contextlib.aclosing(turns[0].choices):
            whole = await unless_disconnected(request, _whole(state, turns, rid=rid))
        return whole or Response(status_code=CLIENT_CLOSED_REQUEST)
    created = now()

    def usage_chunk() -> bytes:
        chunk = ChatCompletionChunk(
            id=rid,
            created=created,
            model=state.model_id,
            choices=[],
            usage=_usage(turns),
            timings=make_timings(turns[0].choices.results),
        )
        return sse_data(chunk)

    opts = body.stream_options
    return sse_response(
        _chunks(state, turns, rid=rid, created=created),
        rid,
        keep_alive_s=state.config.requests.keep_alive_s,
        final=usage_chunk if opts is not None and opts.include_usage else None,
    )


async def _whole(state: ServerState, turns: Sequence[Turn], *, rid: str) -> ChatCompletionResponse:
    """Read every choice to its end and answer with the whole messages."""
    async for _ in answer_steps(turns):
        pass
    messages = [
        ChatChoice(
            index=t.index,
            message=t.output.message(),
            finish_reason=t.finish_reason,
            logprobs=ChatLogprobs(content=t.logprobs) if t.content_logprobs is not None else None,
        )
        for t in turns
    ]
    return ChatCompletionResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        choices=messages,
        usage=_usage(turns),
        timings=make_timings(turns[0].choices.results),
    )


def _usage(turns: Sequence[Turn]) -> Usage:
    """Usage over every choice, with the reasoning tokens of them all."""
    reasoning = sum(
        t.reasoning_tokens.count(t.output.reasoning) for t in turns if t.reasoning_tokens
    )
    results = turns[0].choices.results
    return make_usage(results, [turns[0].num_prompt_tokens], reasoning_tokens=reasoning)


async def _chunks(
    state: ServerState, turns: Sequence[Turn], *, rid: str, created: int
) -> AsyncGenerator[bytes, None]:
    """The choices' chunks: the assistant role first, then reasoning, content and tool deltas;
    logprobs ride on the chunk with the content they spell."""

    def chunk(choice: ChunkChoice) -> bytes:
        return sse_data(
            ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[choice])
        )

    async with contextlib.aclosing(turns[0].choices):
        for t in turns:
            yield chunk(ChunkChoice(index=t.index, delta=ChoiceDelta(role="assistant", content="")))
        async for step in answer_steps(turns):
            lp = ChatLogprobs(content=step.logprobs) if step.logprobs else None
            at = next((j for j, d in enumerate(step.deltas) if d.content), None)
            for j, delta in enumerate(step.deltas):
                yield chunk(
                    ChunkChoice(index=step.index, delta=delta, logprobs=lp if j == at else None)
                )
            if lp is not None and at is None:
                yield chunk(ChunkChoice(index=step.index, delta=ChoiceDelta(), logprobs=lp))
            if step.finish_reason is not None:
                reason = step.finish_reason
                yield chunk(
                    ChunkChoice(index=step.index, delta=ChoiceDelta(), finish_reason=reason)
                )
