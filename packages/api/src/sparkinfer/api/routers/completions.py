"""`POST /v1/completions`: text or token-id prompts, streamed or not."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sparkinfer.api.dependencies import ServerState, State, new_request_id, now
from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.generation import ChoiceEvent, ChoiceJob, ChoiceResult, start_choices
from sparkinfer.api.sampling import build_params, check_context
from sparkinfer.api.schemas.common import PromptTokensDetails, Usage
from sparkinfer.api.schemas.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from sparkinfer.api.streaming import DONE, sse_data, sse_error, sse_response
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import TokenLogprob

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


def make_usage(results: Sequence[ChoiceResult], num_prompt_tokens: int) -> Usage:
    """Billing counts (the prompt counted once per prompt, not per choice) plus telemetry."""
    completion = sum(r.num_output_tokens for r in results)
    first = results[0].metrics if results else None
    return Usage(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=completion,
        total_tokens=num_prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=max((r.num_cached_tokens for r in results), default=0)
        ),
        ttft_ms=first.ttft_ms if first else None,
        generation_ms=first.generation_ms if first else None,
        decode_tps=first.decode_tps if first else None,
    )


def completion_logprobs(
    tokenizer: Tokenizer, entries: Sequence[TokenLogprob], offset: int
) -> CompletionLogprobs:
    """The legacy completions logprobs shape (tokens, token_logprobs, top_logprobs, text_offset)."""
    out = CompletionLogprobs()
    for entry in entries:
        token = tokenizer.decode([entry.token_id])
        out.tokens.append(token)
        out.token_logprobs.append(entry.logprob)
        out.top_logprobs.append({tokenizer.decode([t]): lp for t, lp in entry.top})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def _encode_prompts(body: CompletionRequest, state: ServerState) -> list[list[int]]:
    prompts: list[list[int]] = []
    for i, prompt in enumerate(body.prompts()):
        param = "prompt" if len(body.prompts()) == 1 else f"prompt[{i}]"
        # The raw prompt is the client's own text: control tokens in it are meant as such.
        ids = (
            state.tokenizer.encode(prompt, allow_special=True)
            if isinstance(prompt, str)
            else prompt
        )
        if not ids:
            raise InvalidRequest(f"{param} encodes to no tokens: send some text", param=param)
        bad = [t for t in ids if t >= state.model_vocab_size]
        if bad:
            raise InvalidRequest(
                f"{param} holds token id {bad[0]}; ids are below {state.model_vocab_size}",
                param=param,
            )
        check_context(len(ids), body.max_tokens, state.max_model_len, prompt_param=param)
        prompts.append(ids)
    return prompts


def _jobs(body: CompletionRequest, state: ServerState, prompts: list[list[int]], rid: str):
    jobs: list[ChoiceJob] = []
    for p, ids in enumerate(prompts):
        for c in range(body.n):
            index = p * body.n + c
            params = build_params(
                body, state, max_tokens=body.max_tokens, logprobs=body.logprobs, choice_idx=c
            )
            jobs.append(ChoiceJob(index, f"{rid}-{index}", ids, params, body.stop_strings))
    return jobs


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, state: State
) -> Response | CompletionResponse:
    state.check_model(body.model)
    rid = new_request_id("cmpl")
    request.state.request_id = rid
    prompts = _encode_prompts(body, state)
    jobs = _jobs(body, state, prompts, rid)
    num_prompt_tokens = sum(len(p) for p in prompts)
    echoes = [state.tokenizer.decode(prompts[j.index // body.n]) if body.echo else "" for j in jobs]
    events, _, results = start_choices(state.engine, state.tokenizer, jobs)
    logger.info("request %s: %d prompt tokens, %d choices", rid, num_prompt_tokens, len(jobs))
    if body.stream:
        return sse_response(
            _stream(body, state, rid, events, results, echoes, num_prompt_tokens),
            keep_alive_s=state.settings.keep_alive_s,
        )
    texts = list(echoes)
    finish: list[str | None] = [None] * len(jobs)
    logprobs = [CompletionLogprobs() if body.logprobs is not None else None for _ in jobs]
    try:
        async for ev in events:
            if (lp := logprobs[ev.index]) is not None:
                more = completion_logprobs(state.tokenizer, ev.logprobs, len(texts[ev.index]))
                for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    getattr(lp, name).extend(getattr(more, name))
            texts[ev.index] += ev.text
            finish[ev.index] = ev.finish_reason or finish[ev.index]
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    choices = [
        CompletionChoice(index=i, text=texts[i], finish_reason=finish[i], logprobs=logprobs[i])
        for i in range(len(jobs))
    ]
    return CompletionResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        choices=choices,
        usage=make_usage(results, num_prompt_tokens),
    )


async def _stream(
    body: CompletionRequest,
    state: ServerState,
    rid: str,
    events: AsyncIterator[ChoiceEvent],
    results: list[ChoiceResult],
    echoes: list[str],
    num_prompt_tokens: int,
) -> AsyncIterator[bytes]:
    created = now()

    def chunk(index: int, text: str, finish: str | None, lp: CompletionLogprobs | None) -> bytes:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=lp)
        return sse_data(
            CompletionResponse(id=rid, created=created, model=state.model_id, choices=[choice])
        )

    offsets = [len(e) for e in echoes]
    try:
        for i, echo in enumerate(echoes):
            if echo:
                yield chunk(i, echo, None, None)
        async for ev in events:
            lp = None
            if body.logprobs is not None:
                lp = completion_logprobs(state.tokenizer, ev.logprobs, offsets[ev.index])
            offsets[ev.index] += len(ev.text)
            yield chunk(ev.index, ev.text, ev.finish_reason, lp)
        opts = body.stream_options
        if opts is not None and opts.include_usage:
            usage = make_usage(results, num_prompt_tokens)
            yield sse_data(
                CompletionResponse(
                    id=rid, created=created, model=state.model_id, choices=[], usage=usage
                )
            )
        yield DONE
    except Exception as exc:
        yield sse_error(exc, rid)
        yield DONE
    finally:
        await events.aclose()  # type: ignore[attr-defined]
