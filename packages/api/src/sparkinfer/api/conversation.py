"""The one conversation core behind chat completions, Anthropic Messages and OpenAI Responses.

Each protocol is a thin adapter: it turns its body into a `Conversation` once at its edge
(`conversation_value`), starts it here, and maps the one output parser's deltas (`ChatOutput`:
reasoning split, tool calls, JSON) to its own events. A fix in the core is a fix in all three.
Errors raised here name internal fields; `Conversation.remap` renames them to the protocol's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from sparkinfer.api.chat_output import ChatOutput, ReasoningTokenCounter, to_chat_logprobs
from sparkinfer.api.chat_request import (
    PreparedChat,
    chat_options,
    conversation_prompt_ids,
    prepare_chat,
    schema_limits,
    with_processor,
)
from sparkinfer.api.content_logprobs import ContentLogprobs
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.dependencies import ServerState
from sparkinfer.api.errors import InternalError, to_api_error
from sparkinfer.api.generation import ChoiceJob, Choices, start_choices
from sparkinfer.api.media import load_media, media_parts
from sparkinfer.api.request_ids import engine_request_id
from sparkinfer.api.sampling import build_params
from sparkinfer.api.schemas.chat import ChoiceDelta
from sparkinfer.api.schemas.common import TokenLogprobEntry, Usage
from sparkinfer.api.tools import (
    check_response_format_schema,
    check_response_format_stops,
    check_tools,
)
from sparkinfer.api.usage import make_usage
from sparkinfer.scheduler.request import TokenLogprob
from starlette.concurrency import run_in_threadpool


def output_parser(conv: Conversation, prep: PreparedChat) -> ChatOutput:
    """A fresh output parser for one answer of `conv` (the same for every protocol)."""
    return ChatOutput(
        is_thinking=prep.thinking.is_enabled,
        is_reasoning_excluded=prep.thinking.is_excluded,
        tools=prep.tools if conv.tool_choice != "none" else None,
        is_tool_call_forced=prep.is_tool_call_forced,
        response_schema=prep.response_schema,
    )


@dataclass
class Turn:
    """One started answer of a conversation (choice `index` of its `n`): its output parser."""

    conversation: Conversation
    prepared: PreparedChat
    output: ChatOutput
    choices: Choices  # the request's engine choices, shared by its n answers
    num_prompt_tokens: int
    index: int = 0  # which of the request's answers this is
    stop_string: str | None = None  # the stop sequence that ended the answer, if one did
    finish_reason: str | None = None  # chat's reason (stop, length, tool_calls), once finished
    is_context_bound: bool = False  # the context window, not max_tokens, bounds the answer
    reasoning_tokens: ReasoningTokenCounter | None = None  # fed by answer_steps
    content_logprobs: ContentLogprobs | None = None  # when logprobs were asked for
    logprobs: list[TokenLogprobEntry] = field(default_factory=list[TokenLogprobEntry])

    @property
    def usage(self) -> Usage:
        """The request's usage (every answer's output tokens; the prompt counted once)."""
        return make_usage(self.choices.results, [self.num_prompt_tokens])


@dataclass(frozen=True)
class TurnStep:
    """What one engine step added to answer `index`: output deltas, and the finish reason on
    its last step."""

    deltas: list[ChoiceDelta]
    finish_reason: str | None = None
    logprobs: list[TokenLogprobEntry] = field(
        default_factory=list[TokenLogprobEntry]
    )  # of the content it released
    index: int = 0


async def start_turn(
    conv: Conversation,
    state: ServerState,
    rid: str,
    *,
    client: str = "",
) -> Turn:
    """`start_turns` for a conversation of one answer (Messages, Responses)."""
    (turn,) = await start_turns(conv, state, rid, client=client)
    return turn


async def start_turns(
    conv: Conversation,
    state: ServerState,
    rid: str,
    *,
    client: str = "",
) -> list[Turn]:
    """Check and render the conversation once, then queue its `n` answers, one engine choice
    each (errors name the protocol's fields; nothing is queued when one is raised)."""
    limits = conv.limits
    checked_limit = None if limits.is_fit_to_context else limits.max_tokens
    try:
        check_response_format_stops(conv)
        parts = media_parts(conv.messages, has_vision=state.media is not None)
        media = await load_media(parts, state.media) if parts and state.media else []
        prep = await prepare_chat(conv, state, media, max_tokens=checked_limit, client=client)
    except Exception as exc:
        raise _mapped(conv, exc) from None
    max_tokens = limits.max_tokens
    if limits.is_fit_to_context and max_tokens is not None:
        max_tokens = min(max_tokens, state.max_model_len - len(prep.prompt_token_ids))
    jobs = _jobs(conv, state, prep, rid, max_tokens=max_tokens)
    choices = await start_choices(state.engine, state.tokenizer, jobs)
    asked = limits.max_tokens
    is_context_bound = asked is not None and max_tokens is not None and max_tokens < asked
    return [
        _turn(conv, state, prep, choices, job.index, is_context_bound=is_context_bound)
        for job in jobs
    ]


def _jobs(
    conv: Conversation,
    state: ServerState,
    prep: PreparedChat,
    rid: str,
    *,
    max_tokens: int | None,
) -> list[ChoiceJob]:
    """One engine job per answer, each with its own seed offset and grammar matcher."""
    sampling, rules, limits = conv.sampling, state.sampling, conv.limits
    jobs: list[ChoiceJob] = []
    for c in range(limits.n):
        params = build_params(
            sampling, rules, max_tokens=max_tokens, logprobs=limits.logprobs, choice_idx=c
        )
        params = with_processor(params, prep, state)
        jobs.append(
            ChoiceJob(
                c, engine_request_id(rid, c), prep.prompt_token_ids, params,
                sampling.stop_strings, prep.multimodal,
            )
        )  # fmt: skip
    return jobs


def _turn(
    conv: Conversation,
    state: ServerState,
    prep: PreparedChat,
    choices: Choices,
    index: int,
    *,
    is_context_bound: bool,
) -> Turn:
    """Answer `index` with fresh parsers (the same for every protocol)."""
    is_thinking = prep.thinking.is_enabled
    return Turn(
        conv, prep, output_parser(conv, prep), choices, len(prep.prompt_token_ids), index,
        is_context_bound=is_context_bound,
        reasoning_tokens=ReasoningTokenCounter(state.tokenizer, is_thinking=is_thinking),
        content_logprobs=(
            ContentLogprobs(state.tokenizer, is_thinking=is_thinking)
            if conv.limits.logprobs is not None
            else None
        ),
    )  # fmt: skip


def _mapped(conv: Conversation, exc: Exception) -> Exception:
    """A client error renamed to the protocol's fields; anything else (a bug) unchanged."""
    err = to_api_error(exc)
    if isinstance(err, InternalError):
        return exc
    return conv.remap(err)


def turn_steps(turn: Turn) -> AsyncGenerator[TurnStep, None]:
    """The deltas of a conversation's one answer (`answer_steps` of it alone)."""
    return answer_steps([turn])


async def answer_steps(turns: Sequence[Turn]) -> AsyncGenerator[TurnStep, None]:
    """The answers' deltas step by step, as the engine gives them; each answer's last step
    carries its finish reason (closes the engine choices in any case, so a client that leaves
    aborts them). `turns`: every answer of one `start_turns`."""
    choices = turns[0].choices
    async with contextlib.aclosing(choices):
        async for ev in choices.events:
            turn = turns[ev.index]
            if turn.reasoning_tokens is not None:
                turn.reasoning_tokens.push(ev.token_ids)
            deltas = turn.output.feed(ev.text)
            if ev.finish_reason is None:
                logprobs = _content_logprobs(turn, ev.logprobs, is_final=False)
                if deltas:
                    yield TurnStep(deltas, logprobs=logprobs, index=ev.index)
                continue
            # The engine's reason: a call cut by the token limit is dropped, never raw markup.
            deltas += turn.output.finish(ev.finish_reason)
            turn.stop_string = ev.stop_string
            turn.finish_reason = turn.output.finish_reason(ev.finish_reason)
            logprobs = _content_logprobs(turn, ev.logprobs, is_final=True)
            yield TurnStep(deltas, turn.finish_reason, logprobs, ev.index)


def _content_logprobs(
    turn: Turn, entries: Sequence[TokenLogprob], *, is_final: bool
) -> list[TokenLogprobEntry]:
    """The logprobs of the content this step released (kept on the turn too)."""
    aligner = turn.content_logprobs
    if aligner is None:
        return []
    aligner.push(entries)
    content = turn.output.content
    taken = aligner.finish(content) if is_final else aligner.take(content)
    out = to_chat_logprobs(aligner.tokenizer, taken)
    turn.logprobs += out
    return out


async def run_turn(turn: Turn) -> Turn:
    """Read the answer to its end (non-streaming); the parser then holds the whole output."""
    async for _ in turn_steps(turn):
        pass
    return turn


async def count_prompt_tokens(conv: Conversation, state: ServerState) -> int:
    """The conversation's prompt length as it would be queued (media expanded), nothing queued."""
    try:
        check_tools(conv, limits=schema_limits(state))
        check_response_format_schema(conv, limits=schema_limits(state))
        parts = media_parts(conv.messages, has_vision=state.media is not None)
        media = await load_media(parts, state.media) if parts and state.media else []
        ids, _ = await run_in_threadpool(
            conversation_prompt_ids, state, conv, chat_options(conv, conv.thinking), media
        )
    except Exception as exc:
        raise _mapped(conv, exc) from None
    return len(ids)
