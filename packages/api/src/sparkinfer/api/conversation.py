"""The one conversation core behind chat completions, Anthropic Messages and OpenAI Responses.

Each protocol is a thin adapter: it turns its body into a `Conversation` (the internal
conversation, in the chat-completions shape that the template, the tool checks and the grammar
take), starts it here, and maps the one output parser's deltas (`ChatOutput`: reasoning split,
tool calls, JSON) to its own events. A fix in the core is a fix in all three.

Errors raised while the conversation is prepared name internal fields (`messages[3]`,
`tools[0].function.parameters`); `Conversation.paths` maps them back to the protocol's own
fields (`messages[2].content[1]`, `tools[0].input_schema`), so every 400 names what the client
sent.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pydantic
from sparkinfer.api.chat_output import ChatOutput, ReasoningTokenCounter, to_chat_logprobs
from sparkinfer.api.chat_request import (
    PreparedChat,
    ThinkingControls,
    chat_prompt_ids,
    prepare_chat,
    resolve_thinking,
    schema_limits,
    with_processor,
)
from sparkinfer.api.content_logprobs import ContentLogprobs
from sparkinfer.api.dependencies import ServerState
from sparkinfer.api.errors import ApiError, InternalError, InvalidRequest, to_api_error
from sparkinfer.api.generation import ChoiceJob, Choices, start_choices
from sparkinfer.api.media import load_media, media_parts
from sparkinfer.api.request_ids import engine_request_id
from sparkinfer.api.sampling import Sampling, build_params
from sparkinfer.api.schemas.chat import ChatCompletionRequest, ChoiceDelta, NamedToolChoice
from sparkinfer.api.schemas.common import TokenLogprobEntry, Usage
from sparkinfer.api.tools import (
    check_response_format_schema,
    check_response_format_stops,
    check_tools,
)
from sparkinfer.api.usage import make_usage
from sparkinfer.model.chat_template import ChatOptions
from sparkinfer.scheduler.request import TokenLogprob
from starlette.concurrency import run_in_threadpool

M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class AnswerLimits:
    """How many answers a conversation asks for, and how long, read once at the edge."""

    n: int = 1
    max_tokens: int | None = None  # None: up to the context window
    logprobs: int | None = None  # top logprobs per content token (0: the sampled one); None: off
    # A max_tokens beyond the room the prompt leaves is lowered to that room instead of refused
    # (Anthropic's behaviour: clients send their own model's output limit).
    is_fit_to_context: bool = False


@dataclass(frozen=True)
class Conversation:
    """A request of any protocol, built once at its edge: the internal conversation (messages,
    tools, output format, thinking controls), its sampling, its limits, and where its fields
    came from. Build it with `Conversation.of`."""

    request: ChatCompletionRequest
    sampling: Sampling
    limits: AnswerLimits
    thinking: ThinkingControls  # resolved once (enable_thinking > reasoning > effort > kwargs)
    # (internal field, protocol field) pairs; the longest internal prefix of a param wins.
    paths: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls,
        request: ChatCompletionRequest,
        paths: Sequence[tuple[str, str]] = (),
        *,
        is_fit_to_context: bool = False,
    ) -> Conversation:
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        limits = AnswerLimits(request.n, request.output_limit, logprobs, is_fit_to_context)
        thinking = resolve_thinking(request)
        return cls(request, Sampling.of(request), limits, thinking, tuple(paths))

    def remap(self, err: ApiError) -> ApiError:
        """`err` with its param and message naming the protocol's fields."""
        return remap_error(err, self.paths)


def remap_error(err: ApiError, paths: Sequence[tuple[str, str]]) -> ApiError:
    """`err` renamed by `paths` ((internal field, protocol field); the longest prefix wins)."""
    if err.param is None:
        return err
    param = err.param
    best = max((p for p in paths if _is_prefix(p[0], param)), key=lambda p: len(p[0]), default=None)
    if best is None:
        return err
    inner, outer = best
    err.param = outer + param[len(inner) :]
    err.message = re.sub(r"(?<!\w)" + re.escape(inner) + r"(?!\w)", outer, err.message)
    err.args = (err.message,)
    return err


def _is_prefix(prefix: str, param: str) -> bool:
    return param == prefix or param.startswith((prefix + ".", prefix + "["))


def output_parser(req: ChatCompletionRequest, prep: PreparedChat) -> ChatOutput:
    """A fresh output parser for one answer of `req` (the same for every protocol)."""
    return ChatOutput(
        is_thinking=prep.thinking.is_enabled,
        is_reasoning_excluded=prep.thinking.is_excluded,
        tools=prep.tools if req.tool_choice != "none" else None,
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
    req, limits = conv.request, conv.limits
    checked_limit = None if limits.is_fit_to_context else limits.max_tokens
    try:
        check_response_format_stops(req)
        parts = media_parts(req.messages, has_vision=state.media is not None)
        media = await load_media(parts, state.media) if parts and state.media else []
        prep = await prepare_chat(
            req, state, media, thinking=conv.thinking, max_tokens=checked_limit, client=client
        )
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
    req = conv.request
    return Turn(
        conv, prep, output_parser(req, prep), choices, len(prep.prompt_token_ids), index,
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
    req = conv.request
    try:
        check_tools(req, limits=schema_limits(state))
        check_response_format_schema(req, limits=schema_limits(state))
        parts = media_parts(req.messages, has_vision=state.media is not None)
        media = await load_media(parts, state.media) if parts and state.media else []
        thinking = conv.thinking
        options = ChatOptions(enable_thinking=thinking.is_enabled, reasoning_effort=thinking.effort)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        ids, _ = await run_in_threadpool(
            functools.partial(chat_prompt_ids, is_continued=req.continue_final_message),
            state, req.messages, tools, options, media,
        )  # fmt: skip
    except Exception as exc:
        raise _mapped(conv, exc) from None
    return len(ids)


def is_forced(req: ChatCompletionRequest) -> bool:
    """tool_choice required or named: only calls may come out."""
    return req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice)


def parse_body(model: type[M], data: Any) -> M:
    """`data` as `model`; a 400 naming the first bad field as the client wrote it."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise body_error(exc, data) from None


def body_error(exc: pydantic.ValidationError, data: Any) -> InvalidRequest:
    """A validation error as a 400 naming its field (union tags left out of the path)."""
    # A union's branches each report an error; the one that got deepest into the body is the
    # one the client meant (a list of blocks, not the string it could also have been).
    errors = exc.errors()
    paths = [_path_in(data, e.get("loc", ())) for e in errors]
    deepest = max(range(len(errors)), key=lambda i: (len(paths[i]), -i))
    first, param = errors[deepest], paths[deepest]
    kind = first.get("type")
    if kind == "missing":
        return InvalidRequest(f"{param} is required", param=param or None)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    value = first.get("input")
    shown = (
        repr(value) if not isinstance(value, dict | list) else type(cast(object, value)).__name__
    )
    if len(shown) > 80:
        shown = shown[:77] + "..."
    where = param or "the request body"
    return InvalidRequest(f"{where}: {msg} (got {shown})", param=param or None)


def _path_in(data: Any, loc: Sequence[int | str]) -> str:
    """pydantic's `loc` as `a.b[2].c`, walking `data` so that union tags (`list[...]`, a block's
    `type`) are left out: a part is a key or index of the body, or the missing field at the end."""
    out = ""
    node: Any = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str):
            obj = cast("dict[str, Any]", node)
            if part in obj:
                out += f".{part}" if out else part
                node = obj[part]
            elif i == len(loc) - 1:
                out += f".{part}" if out else part
        elif isinstance(node, list) and isinstance(part, int):
            items = cast("list[Any]", node)
            out += f"[{part}]"
            node = items[part] if 0 <= part < len(items) else None
    return out


def internal_request(
    fields: dict[str, Any], paths: Sequence[tuple[str, str]], *, is_fit_to_context: bool = False
) -> Conversation:
    """Build the internal conversation; a value it refuses is a 400 naming the protocol field."""
    try:
        req = ChatCompletionRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise remap_error(body_error(exc, fields), paths) from None
    try:
        return Conversation.of(req, paths, is_fit_to_context=is_fit_to_context)
    except Exception as exc:  # a control the conversation refuses, such as a reasoning effort
        err = to_api_error(exc)
        if isinstance(err, InternalError):
            raise
        raise remap_error(err, paths) from None
