"""`POST /v1/chat/completions`: messages through the chat template, reasoning and tool calls out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sparkinfer.api.chat_output import ChatOutput, to_chat_logprobs
from sparkinfer.api.chat_request import PreparedChat, prepare_chat, with_processor
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.generation import ChoiceEvent, ChoiceJob, ChoiceResult, start_choices
from sparkinfer.api.media import load_media, media_parts
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
from sparkinfer.api.streaming import DONE, sse_data, sse_error, sse_response
from sparkinfer.api.tools import check_response_format_stops
from sparkinfer.api.usage import make_usage

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


def _jobs(body: ChatCompletionRequest, state: ServerState, prep: PreparedChat, rid: str):
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    jobs = []
    for c in range(body.n):
        params = build_params(
            body, state, max_tokens=body.output_limit, logprobs=logprobs, choice_idx=c
        )
        params = with_processor(params, prep, state)
        engine_id = engine_request_id(rid, c)
        prompt = prep.prompt_token_ids
        jobs.append(ChoiceJob(c, engine_id, prompt, params, body.stop_strings, prep.multimodal))
    return jobs


def _output(body: ChatCompletionRequest, prep: PreparedChat) -> ChatOutput:
    return ChatOutput(
        is_thinking=prep.thinking.is_enabled,
        is_reasoning_excluded=prep.thinking.is_excluded,
        tools=prep.tools if body.tool_choice != "none" else None,
        is_tool_call_forced=prep.is_tool_call_forced,
        response_schema=prep.response_schema,
    )


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State
) -> Response | ChatCompletionResponse:
    state.check_model(body.model)
    rid = f"chatcmpl-{request_id(request)}"
    check_response_format_stops(body)
    parts = media_parts(body.messages, has_vision=state.media is not None)
    media = await load_media(parts, state.media) if parts and state.media else []
    prep = prepare_chat(body, state, media)
    jobs = _jobs(body, state, prep, rid)
    outputs = [_output(body, prep) for _ in jobs]
    events, _, results = start_choices(state.engine, state.tokenizer, jobs)
    num_prompt = len(prep.prompt_token_ids)
    logger.info(
        "request %s: %d prompt tokens (%d media parts), %d choices",
        rid, num_prompt, len(media), len(jobs),
    )  # fmt: skip
    if body.stream:
        stream = _stream(body, state, rid, events, results, outputs, num_prompt)
        return sse_response(stream, keep_alive_s=state.settings.keep_alive_s)
    finish: list[str | None] = [None] * len(jobs)
    logprobs = [ChatLogprobs(content=[]) if body.logprobs else None for _ in jobs]
    try:
        async for ev in events:
            outputs[ev.index].feed(ev.text)
            finish[ev.index] = ev.finish_reason or finish[ev.index]
            if (lp := logprobs[ev.index]) is not None and lp.content is not None:
                lp.content.extend(to_chat_logprobs(state.tokenizer, ev.logprobs))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    choices = []
    for i, out in enumerate(outputs):
        message, reason = out.final_message(finish[i])
        choices.append(
            ChatChoice(index=i, message=message, finish_reason=reason, logprobs=logprobs[i])
        )
    return ChatCompletionResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        choices=choices,
        usage=make_usage(results, [num_prompt]),
    )


async def _stream(
    body: ChatCompletionRequest,
    state: ServerState,
    rid: str,
    events: AsyncIterator[ChoiceEvent],
    results: list[ChoiceResult],
    outputs: list[ChatOutput],
    num_prompt: int,
) -> AsyncIterator[bytes]:
    created = now()

    def chunk(choice: ChunkChoice) -> bytes:
        return sse_data(
            ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[choice])
        )

    try:
        for i in range(len(outputs)):
            yield chunk(ChunkChoice(index=i, delta=ChoiceDelta(role="assistant", content="")))
        async for ev in events:
            out = outputs[ev.index]
            deltas = out.feed(ev.text)
            if ev.finish_reason is not None:
                deltas += out.finish()
            lp = None
            if body.logprobs and ev.logprobs:
                lp = ChatLogprobs(content=to_chat_logprobs(state.tokenizer, ev.logprobs))
            for j, delta in enumerate(deltas):
                yield chunk(
                    ChunkChoice(index=ev.index, delta=delta, logprobs=lp if j == 0 else None)
                )
            if ev.finish_reason is not None:
                reason = out.finish_reason(ev.finish_reason)
                yield chunk(ChunkChoice(index=ev.index, delta=ChoiceDelta(), finish_reason=reason))
            elif not deltas and lp is not None:
                yield chunk(ChunkChoice(index=ev.index, delta=ChoiceDelta(), logprobs=lp))
        opts = body.stream_options
        if opts is not None and opts.include_usage:
            usage = make_usage(results, [num_prompt])
            yield sse_data(
                ChatCompletionChunk(
                    id=rid, created=created, model=state.model_id, choices=[], usage=usage
                )
            )
        yield DONE
    except Exception as exc:
        yield sse_error(exc, rid)
        yield DONE
    finally:
        await events.aclose()  # type: ignore[attr-defined]
