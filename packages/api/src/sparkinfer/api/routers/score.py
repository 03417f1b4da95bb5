"""`POST /v1/score`: the logprob of each token of a given completion after a prompt (evals).

The context (a raw prompt, or chat messages rendered with the generation prompt) and the
completion are tokenized separately and joined; the engine runs them as one prompt with
`prompt_logprobs` and samples a single token, which is dropped.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sparkinfer.api.chat_render import render_chat
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.errors import InvalidMedia
from sparkinfer.api.generation import CLIENT_CLOSED_REQUEST, EngineFailure, unless_disconnected
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import engine_request_id, request_id
from sparkinfer.api.sampling import (
    check_context,
    check_prompt_ids,
    encode_prompt,
    prompt_too_long,
)
from sparkinfer.api.schemas.common import Timings, Usage
from sparkinfer.api.schemas.score import ScoreRequest, ScoreResponse
from sparkinfer.model.bounded_encode import TokenBudgetExceeded
from sparkinfer.model.chat_template import ChatOptions
from sparkinfer.scheduler.request import RequestOutput, SamplingParams, TokenLogprob
from starlette.concurrency import run_in_threadpool

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


def _context_ids(body: ScoreRequest, state: ServerState) -> list[int]:
    if body.messages is None:
        prompt = body.prompt or ""
        return (
            encode_prompt(state.tokenizer, prompt, state.max_model_len, param="prompt")
            if isinstance(prompt, str)
            else prompt
        )
    for i, msg in enumerate(body.messages):
        for j, part in enumerate(msg.content if isinstance(msg.content, list) else []):
            if part.type != "text":
                raise InvalidMedia(
                    f"messages[{i}].content[{j}] is {part.type}; /v1/score takes text only",
                    param=f"messages[{i}].content[{j}]",
                )
    options = ChatOptions(
        add_generation_prompt=True,
        enable_thinking=True if body.enable_thinking is None else body.enable_thinking,
        template_kwargs=body.chat_template_kwargs or {},
    )
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    segments = render_chat(state.chat_template, messages, tools=None, options=options).segments
    try:
        return state.tokenizer.encode_chat(segments, max_tokens=state.max_model_len - 1)
    except TokenBudgetExceeded:
        raise prompt_too_long("messages", state.max_model_len) from None


def _checked_ids(body: ScoreRequest, state: ServerState) -> tuple[list[int], list[int]]:
    """The context and completion ids, checked against the vocabulary and the context window."""
    param = "prompt" if body.messages is None else "messages"
    context = check_prompt_ids(_context_ids(body, state), param, state.tokenizer)
    completion = body.completion
    if isinstance(completion, str):
        completion = encode_prompt(
            state.tokenizer, completion, state.max_model_len, param="completion"
        )
    completion = check_prompt_ids(completion, "completion", state.tokenizer)
    num_ids = len(context) + len(completion)
    check_context(num_ids, 1, state.max_model_len, prompt_param=f"{param} plus completion")
    return context, completion


async def _prompt_logprobs(
    state: ServerState, engine_id: str, ids: list[int], num_top: int
) -> tuple[tuple[TokenLogprob, ...], RequestOutput]:
    """Run `ids` as a prompt; its prompt logprobs and the final output."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=num_top)
    stream = await state.engine.submit(engine_id, ids, params)
    entries: tuple[TokenLogprob, ...] = ()
    try:
        async for out in stream:
            entries = entries or out.prompt_logprobs
            if out.is_finished:
                if len(entries) != len(ids) - 1:
                    logger.error("request %s ended %s: %s", engine_id, out.finish_reason, out.error)
                    raise EngineFailure(
                        f"the engine did not score request {engine_id}; the cause is in the "
                        "server log under that id"
                    )
                return entries, out
    finally:
        state.engine.abort_all([stream])  # no-op once finished
    raise AssertionError("a request stream ends with a finished output")


@router.post("/v1/score", response_model=ScoreResponse)
async def score(
    body: Annotated[ScoreRequest, Depends(JsonBody(ScoreRequest))], request: Request, state: State
) -> Response | ScoreResponse:
    """Per-token logprobs of `completion`, their sum and whether each token was the top one.

    A client that disconnects first aborts the engine request (it answers nobody).
    """
    state.check_model(body.model)
    rid = f"score-{request_id(request)}"
    # A long context takes the CPU for up to seconds to tokenize: off the event loop.
    context, completion = await run_in_threadpool(_checked_ids, body, state)
    ids = context + completion
    logger.info("request %s: %d completion tokens after %d", rid, len(completion), len(context))
    num_top = body.top_logprobs or 0
    work = _prompt_logprobs(state, engine_request_id(rid, 0), ids, max(1, num_top))
    result = await unless_disconnected(request, work)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    entries, final = result
    scored = entries[len(context) - 1 :]  # entry i scores token i + 1
    decode = state.tokenizer.decode
    top = None
    if body.top_logprobs is not None:
        top = [{decode([t]): lp for t, lp in e.top[:num_top]} for e in scored]
    return ScoreResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        tokens=[decode([e.token_id]) for e in scored],
        token_ids=[e.token_id for e in scored],
        token_logprobs=[e.logprob for e in scored],
        top_logprobs=top,
        logprob=sum(e.logprob for e in scored),
        is_greedy=all(e.logprob >= e.top[0][1] for e in scored),
        usage=Usage(
            prompt_tokens=len(ids),
            completion_tokens=0,
            total_tokens=len(ids),
        ),
        timings=Timings(ttft_ms=final.metrics.ttft_ms),
    )
