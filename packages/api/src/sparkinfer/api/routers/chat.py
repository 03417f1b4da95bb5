"""`POST /v1/chat/completions`: messages through the chat template, reasoning and tool calls out."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sparkinfer.api.chat_output import ChatOutput, ReasoningTokenCounter, to_chat_logprobs
from sparkinfer.api.chat_request import PreparedChat, prepare_chat, with_processor
from sparkinfer.api.content_logprobs import ContentLogprobs
from sparkinfer.api.conversation import output_parser
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.edge import client_id
from sparkinfer.api.generation import (
    CLIENT_CLOSED_REQUEST,
    ChoiceEvent,
    ChoiceJob,
    Choices,
    start_choices,
    unless_disconnected,
)
from sparkinfer.api.media import load_media, media_parts
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import engine_request_id, request_id
from sparkinfer.api.sampling import build_params
from sparkinfer.api.schemas.chat import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceDelta,
    ChunkChoice,
)
from sparkinfer.api.schemas.common import ChatLogprobs
from sparkinfer.api.streaming import sse_data, sse_response
from sparkinfer.api.tools import check_response_format_stops
from sparkinfer.api.usage import make_timings, make_usage

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


def _jobs(
    body: ChatCompletionRequest, state: ServerState, prep: PreparedChat, rid: str
) -> list[ChoiceJob]:
    """One engine job per choice, each with its own seed offset and grammar matcher."""
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    jobs: list[ChoiceJob] = []
    for c in range(body.n):
        params = build_params(
            body, state, max_tokens=body.output_limit, logprobs=logprobs, choice_idx=c
        )
        params = with_processor(params, prep, state)
        engine_id = engine_request_id(rid, c)
        prompt = prep.prompt_token_ids
        jobs.append(ChoiceJob(c, engine_id, prompt, params, body.stop_strings, prep.multimodal))
    return jobs


@dataclass(frozen=True)
class _ChoiceParsers:
    """One choice's output parser, reasoning-token counter and content logprobs."""

    output: ChatOutput
    counter: ReasoningTokenCounter
    logprobs: ContentLogprobs | None  # None: not asked for


def _parsers(body: ChatCompletionRequest, state: ServerState, prep: PreparedChat) -> _ChoiceParsers:
    """Fresh parsers for one choice (the output parser is the one the other protocols use)."""
    thinking = prep.thinking.is_enabled
    return _ChoiceParsers(
        output_parser(body, prep),
        ReasoningTokenCounter(state.tokenizer, is_thinking=thinking),
        ContentLogprobs(state.tokenizer, is_thinking=thinking) if body.logprobs else None,
    )


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
    check_response_format_stops(body)
    parts = media_parts(body.messages, has_vision=state.media is not None)
    media = await load_media(parts, state.media) if parts and state.media else []
    prep = await prepare_chat(body, state, media, client=client_id(request.scope))
    jobs = _jobs(body, state, prep, rid)
    parsers = [_parsers(body, state, prep) for _ in jobs]
    choices = await start_choices(state.engine, state.tokenizer, jobs)
    num_prompt = len(prep.prompt_token_ids)
    logger.info(
        "request %s: %d prompt tokens (%d media parts), %d choices",
        rid, num_prompt, len(media), len(jobs),
    )  # fmt: skip
    if not body.stream:
        async with contextlib.aclosing(choices):
            whole = await unless_disconnected(
                request,
                _whole(state, choices, parsers, rid=rid, num_prompt=num_prompt),
            )
        return whole or Response(status_code=CLIENT_CLOSED_REQUEST)
    created = now()

    def usage_chunk() -> bytes:
        usage = make_usage(
            choices.results, [num_prompt], reasoning_tokens=_reasoning_tokens(parsers)
        )
        chunk = ChatCompletionChunk(
            id=rid,
            created=created,
            model=state.model_id,
            choices=[],
            usage=usage,
            timings=make_timings(choices.results),
        )
        return sse_data(chunk)

    opts = body.stream_options
    return sse_response(
        _chunks(state, choices, parsers, rid=rid, created=created),
        rid,
        keep_alive_s=state.settings.keep_alive_s,
        final=usage_chunk if opts is not None and opts.include_usage else None,
    )


async def _whole(
    state: ServerState,
    choices: Choices,
    parsers: list[_ChoiceParsers],
    *,
    rid: str,
    num_prompt: int,
) -> ChatCompletionResponse:
    """Read every choice to its end and answer with the whole messages (the caller closes)."""
    finish: list[str | None] = [None] * len(parsers)
    async for ev in choices.events:
        p = parsers[ev.index]
        p.output.feed(ev.text)
        p.counter.push(ev.token_ids)
        if p.logprobs is not None:
            p.logprobs.push(ev.logprobs)
        finish[ev.index] = ev.finish_reason or finish[ev.index]
    messages: list[ChatChoice] = []
    for i, p in enumerate(parsers):
        message, reason = p.output.final_message(finish[i])
        logprobs = None
        if p.logprobs is not None:
            entries = p.logprobs.finish(p.output.content)
            logprobs = ChatLogprobs(content=to_chat_logprobs(state.tokenizer, entries))
        messages.append(
            ChatChoice(index=i, message=message, finish_reason=reason, logprobs=logprobs)
        )
    return ChatCompletionResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        choices=messages,
        usage=make_usage(
            choices.results, [num_prompt], reasoning_tokens=_reasoning_tokens(parsers)
        ),
        timings=make_timings(choices.results),
    )


def _reasoning_tokens(parsers: list[_ChoiceParsers]) -> int:
    return sum(p.counter.count(p.output.reasoning) for p in parsers)


def _step_logprobs(state: ServerState, p: _ChoiceParsers, ev: ChoiceEvent) -> ChatLogprobs | None:
    """The logprobs of the content this event released (None: not asked for, or none)."""
    if p.logprobs is None:
        return None
    p.logprobs.push(ev.logprobs)
    content = p.output.content
    entries = p.logprobs.take(content) if ev.finish_reason is None else p.logprobs.finish(content)
    return ChatLogprobs(content=to_chat_logprobs(state.tokenizer, entries)) if entries else None


async def _chunks(
    state: ServerState,
    choices: Choices,
    parsers: list[_ChoiceParsers],
    *,
    rid: str,
    created: int,
) -> AsyncGenerator[bytes, None]:
    """The choices' chunks: the assistant role first, then reasoning, content and tool deltas;
    logprobs ride on the chunk with the content they spell."""

    def chunk(choice: ChunkChoice) -> bytes:
        return sse_data(
            ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[choice])
        )

    async with contextlib.aclosing(choices):
        for i in range(len(parsers)):
            yield chunk(ChunkChoice(index=i, delta=ChoiceDelta(role="assistant", content="")))
        async for ev in choices.events:
            p = parsers[ev.index]
            p.counter.push(ev.token_ids)
            deltas = p.output.feed(ev.text)
            if ev.finish_reason is not None:
                deltas += p.output.finish(ev.finish_reason)
            lp = _step_logprobs(state, p, ev)
            at = next((j for j, d in enumerate(deltas) if d.content), None)
            for j, delta in enumerate(deltas):
                yield chunk(
                    ChunkChoice(index=ev.index, delta=delta, logprobs=lp if j == at else None)
                )
            if lp is not None and at is None:
                yield chunk(ChunkChoice(index=ev.index, delta=ChoiceDelta(), logprobs=lp))
            if ev.finish_reason is not None:
                reason = p.output.finish_reason(ev.finish_reason)
                yield chunk(ChunkChoice(index=ev.index, delta=ChoiceDelta(), finish_reason=reason))
