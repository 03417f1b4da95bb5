"""`POST /v1/completions`: text or token-id prompts, streamed or not.

The body becomes one frozen `Completion` at the top of the route (its prompts, `Sampling` and
`AnswerLimits`, the conversation core's sampling and limit values); the rest reads only that.

With `echo` and `logprobs` the prompt's tokens come first in the logprobs too (the engine's
prompt logprobs; the first token has none, as in OpenAI's API).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sparkinfer.api.conversation_value import AnswerLimits
from sparkinfer.api.dependencies import ServerState, State, now
from sparkinfer.api.generation import (
    CLIENT_CLOSED_REQUEST,
    ChoiceEvent,
    ChoiceJob,
    ChoiceResult,
    Choices,
    start_choices,
    unless_disconnected,
)
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.request_ids import engine_request_id, request_id
from sparkinfer.api.sampling import (
    Sampling,
    build_params,
    check_context,
    check_prompt_ids,
    encode_prompt,
)
from sparkinfer.api.schemas.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from sparkinfer.api.streaming import sse_data, sse_response
from sparkinfer.api.usage import make_timings, make_usage
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import TokenLogprob
from starlette.concurrency import run_in_threadpool

logger = logging.getLogger("sparkinfer.api")
router = APIRouter()


def completion_logprobs(
    tokenizer: Tokenizer, entries: Sequence[TokenLogprob], offset: int
) -> CompletionLogprobs:
    """The legacy completions logprobs shape (tokens, token_logprobs, top_logprobs, text_offset)."""
    out = CompletionLogprobs()
    for entry in entries:
        token = tokenizer.decode([entry.token_id])
        out.tokens.append(token)
        out.token_logprobs.append(entry.logprob)
        # The sampled token is always among the top ones (so logprobs=0 still has it), as in
        # OpenAI's and vLLM's API: up to logprobs + 1 entries.
        top = {tokenizer.decode([t]): lp for t, lp in entry.top}
        top.setdefault(token, entry.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def echo_logprobs(
    tokenizer: Tokenizer, prompt: Sequence[int], entries: Sequence[TokenLogprob]
) -> CompletionLogprobs:
    """The echoed prompt's logprobs: None for its first token, then the engine's entries."""
    first = tokenizer.decode([prompt[0]])
    out = completion_logprobs(tokenizer, entries, len(first))
    out.tokens.insert(0, first)
    out.token_logprobs.insert(0, None)
    out.top_logprobs.insert(0, None)
    out.text_offset.insert(0, 0)
    return out


def _extend(lp: CompletionLogprobs, more: CompletionLogprobs) -> None:
    """Append `more`'s entries to `lp`."""
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        getattr(lp, name).extend(getattr(more, name))


@dataclass(frozen=True)
class Completion:
    """A completions body, read once at the edge."""

    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids, per prompt of the batch
    sampling: Sampling
    limits: AnswerLimits  # n per prompt; max_tokens 0: the prompt alone (echo)
    is_echo: bool

    @classmethod
    def of(cls, body: CompletionRequest) -> Completion:
        prompts = tuple(p if isinstance(p, str) else tuple(p) for p in body.prompts())
        limits = AnswerLimits(body.n, body.max_tokens, body.logprobs)
        return cls(prompts, Sampling.of(body), limits, body.echo)


def _encode_prompts(comp: Completion, state: ServerState) -> tuple[list[list[int]], list[str]]:
    """Each prompt as token ids, checked against the vocabulary and the context window, and its
    text as echoed back ("" without `echo`)."""
    prompts = comp.prompts
    encoded: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        # The raw prompt is the client's own text: control tokens in it are meant as such.
        ids = (
            encode_prompt(state.tokenizer, prompt, state.max_model_len, param=param)
            if isinstance(prompt, str)
            else list(prompt)
        )
        check_prompt_ids(ids, param, state.tokenizer)
        check_context(len(ids), comp.limits.max_tokens, state.max_model_len, prompt_param=param)
        encoded.append(ids)
    return encoded, [state.tokenizer.decode(p) if comp.is_echo else "" for p in encoded]


def _jobs(
    comp: Completion, state: ServerState, prompts: list[list[int]], rid: str
) -> list[ChoiceJob]:
    """n engine jobs per prompt, indexed prompt by prompt."""
    jobs: list[ChoiceJob] = []
    sampling, rules, limits = comp.sampling, state.sampling, comp.limits
    # max_tokens 0: the engine draws one token (prefill yields the prompt's logprobs), dropped.
    max_tokens = 1 if limits.max_tokens == 0 else limits.max_tokens
    for p, ids in enumerate(prompts):
        for c in range(limits.n):
            index = p * limits.n + c
            params = build_params(
                sampling, rules, max_tokens=max_tokens, logprobs=limits.logprobs, choice_idx=c
            )
            if comp.is_echo and limits.logprobs is not None:
                params = dataclasses.replace(params, prompt_logprobs=limits.logprobs)
            engine_id = engine_request_id(rid, index)
            jobs.append(ChoiceJob(index, engine_id, ids, params, sampling.stop_strings))
    return jobs


@router.post(
    "/v1/completions",
    response_model=None,
    responses={200: {"model": CompletionResponse, "description": "The answer, or its chunks"}},
)
async def create_completion(
    body: Annotated[CompletionRequest, Depends(JsonBody(CompletionRequest))],
    request: Request,
    state: State,
) -> Response | CompletionResponse:
    """Encode and check the prompts, queue n choices of each, then stream them or answer whole."""
    state.check_model(body.model)
    rid = f"cmpl-{request_id(request)}"
    # Tokenizing (and echoing) a long prompt takes the CPU for up to seconds (a 1 MB prompt); on
    # a worker thread, the event loop keeps streaming everyone else's tokens.
    comp = Completion.of(body)
    prompts, texts = await run_in_threadpool(_encode_prompts, comp, state)
    jobs = _jobs(comp, state, prompts, rid)
    prompt_lens = [len(p) for p in prompts]
    echoes = [texts[j.index // comp.limits.n] for j in jobs]
    choices = await start_choices(state.engine, state.tokenizer, jobs)
    if comp.limits.max_tokens == 0:
        choices.events = _prompt_only(choices.events, choices.results)
    logger.info("request %s: %d prompt tokens, %d choices", rid, sum(prompt_lens), len(jobs))
    if not body.stream:
        async with contextlib.aclosing(choices):
            whole = await unless_disconnected(
                request, _whole(comp, state, choices, prompts, rid=rid, echoes=echoes)
            )
        return whole or Response(status_code=CLIENT_CLOSED_REQUEST)
    created = now()

    def usage_chunk() -> bytes:
        usage = make_usage(choices.results, prompt_lens)
        chunk = CompletionResponse(
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
        _chunks(comp, state, choices, prompts, rid=rid, created=created, echoes=echoes),
        rid,
        keep_alive_s=state.config.requests.keep_alive_s,
        final=usage_chunk if opts is not None and opts.include_usage else None,
    )


async def _prompt_only(
    events: AsyncGenerator[ChoiceEvent, None], results: list[ChoiceResult]
) -> AsyncGenerator[ChoiceEvent, None]:
    """The events of max_tokens 0: the drawn token is dropped (its text, logprobs and count)."""
    async with contextlib.aclosing(events):
        async for ev in events:
            results[ev.index].num_output_tokens = 0
            finish = None if ev.finish_reason is None else "length"
            yield dataclasses.replace(ev, text="", token_ids=(), logprobs=(), finish_reason=finish)


async def _whole(
    comp: Completion,
    state: ServerState,
    choices: Choices,
    prompts: list[list[int]],
    *,
    rid: str,
    echoes: list[str],
) -> CompletionResponse:
    """Read every choice to its end and answer with the whole texts (the caller closes)."""
    texts = list(echoes)
    finish: list[str | None] = [None] * len(texts)
    n, is_logprobs = comp.limits.n, comp.limits.logprobs is not None
    logprobs = [CompletionLogprobs() if is_logprobs else None for _ in texts]
    async for ev in choices.events:
        if (lp := logprobs[ev.index]) is not None:
            if comp.is_echo and not lp.tokens:
                prompt = prompts[ev.index // n]
                _extend(lp, echo_logprobs(state.tokenizer, prompt, ev.prompt_logprobs))
            more = completion_logprobs(state.tokenizer, ev.logprobs, len(texts[ev.index]))
            _extend(lp, more)
        texts[ev.index] += ev.text
        finish[ev.index] = ev.finish_reason or finish[ev.index]
    return CompletionResponse(
        id=rid,
        created=now(),
        model=state.model_id,
        choices=[
            CompletionChoice(index=i, text=text, finish_reason=finish[i], logprobs=logprobs[i])
            for i, text in enumerate(texts)
        ],
        usage=make_usage(choices.results, [len(p) for p in prompts]),
        timings=make_timings(choices.results),
    )


async def _chunks(
    comp: Completion,
    state: ServerState,
    choices: Choices,
    prompts: list[list[int]],
    *,
    rid: str,
    created: int,
    echoes: list[str],
) -> AsyncGenerator[bytes, None]:
    """The choices' chunks: each echo first (with its logprobs, if asked for), then the text."""

    def chunk(index: int, text: str, finish: str | None, lp: CompletionLogprobs | None) -> bytes:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=lp)
        return sse_data(
            CompletionResponse(id=rid, created=created, model=state.model_id, choices=[choice])
        )

    offsets = [len(e) for e in echoes]
    held = list(echoes)
    # With logprobs an echo waits for the first output, which carries the prompt's logprobs.
    n, is_logprobs = comp.limits.n, comp.limits.logprobs is not None
    is_echo_held = comp.is_echo and is_logprobs
    async with contextlib.aclosing(choices):
        for i, echo in enumerate(echoes):
            if echo and not is_echo_held:
                yield chunk(i, echo, None, None)
        async for ev in choices.events:
            lp = None
            if is_echo_held and held[ev.index]:
                prompt = prompts[ev.index // n]
                echo_lp = echo_logprobs(state.tokenizer, prompt, ev.prompt_logprobs)
                yield chunk(ev.index, held[ev.index], None, echo_lp)
                held[ev.index] = ""
            if is_logprobs:
                lp = completion_logprobs(state.tokenizer, ev.logprobs, offsets[ev.index])
            offsets[ev.index] += len(ev.text)
            yield chunk(ev.index, ev.text, ev.finish_reason, lp)
