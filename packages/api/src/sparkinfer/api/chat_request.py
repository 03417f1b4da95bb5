"""A chat request prepared at the edge: thinking controls, rendered prompt, grammar."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkinfer.api.chat_render import render_chat
from sparkinfer.api.dependencies import ServerState
from sparkinfer.api.errors import InvalidRequest, InvalidToolSchema
from sparkinfer.api.grammar import (
    GrammarTimeout,
    UnsupportedSchema,
    auto_tool_grammar,
    json_grammar,
    reasoning_grammar,
    tool_call_grammar,
)
from sparkinfer.api.media import expand_media, template_messages
from sparkinfer.api.sampling import check_context, prompt_too_long
from sparkinfer.api.schemas.chat import ChatCompletionRequest, ChatMessage, NamedToolChoice
from sparkinfer.api.tools import (
    SchemaLimits,
    ToolSet,
    check_response_format_schema,
    check_tools,
)
from sparkinfer.model.bounded_encode import TokenBudgetExceeded
from sparkinfer.model.chat_template import ChatOptions, map_reasoning_effort
from sparkinfer.multimodal import ProcessedMedia
from sparkinfer.scheduler.request import MultimodalInputs, SamplingParams
from starlette.concurrency import run_in_threadpool
from xgrammar.structural_tag import StructuralTag

logger = logging.getLogger("sparkinfer.api")
_THINKING_KWARGS = ("enable_thinking", "reasoning_effort")


@dataclass(frozen=True)
class ThinkingControls:
    """Whether the model thinks, at which effort, within which budget, and if it is returned."""

    is_enabled: bool = True
    effort: str | None = None  # the template's level (xhigh, medium, low); None: its default
    budget: int | None = None  # reasoning tokens before `</think>` is forced
    is_excluded: bool = False  # reasoning is generated but not returned


def resolve_thinking(req: ChatCompletionRequest) -> ThinkingControls:
    """Precedence: enable_thinking > reasoning object > reasoning_effort > chat_template_kwargs."""
    kwargs = req.chat_template_kwargs or {}
    enabled: bool | None = None
    effort: str | None = None
    if isinstance(kwargs.get("enable_thinking"), bool):
        enabled = kwargs["enable_thinking"]
    if isinstance(kwargs.get("reasoning_effort"), str):
        effort = kwargs["reasoning_effort"]
    if req.reasoning_effort is not None:
        setting = map_reasoning_effort(req.reasoning_effort)
        enabled, effort = setting.enable_thinking, setting.reasoning_effort or effort
    r = req.reasoning
    if r is not None:
        if r.effort is not None:
            setting = map_reasoning_effort(r.effort, param="reasoning.effort")
            enabled, effort = setting.enable_thinking, setting.reasoning_effort or effort
        if r.enabled is not None:
            enabled = r.enabled
        elif r.max_tokens is not None and r.effort is None:
            enabled = True
    if req.enable_thinking is not None:
        enabled = req.enable_thinking
    is_enabled = True if enabled is None else enabled
    return ThinkingControls(
        is_enabled=is_enabled,
        effort=effort if is_enabled else None,
        budget=r.max_tokens if r is not None else None,
        is_excluded=bool(r and r.exclude),
    )


@dataclass(frozen=True)
class PreparedChat:
    """Everything the chat route needs after the edge checks."""

    prompt_token_ids: list[int]  # media placeholders expanded
    thinking: ThinkingControls
    tools: ToolSet | None
    is_tool_call_forced: bool  # tool_choice required or named: only calls may come out
    response_schema: dict[str, Any] | bool | None  # json_object / json_schema output
    grammar: Any  # a compiled xgrammar grammar, or None
    multimodal: MultimodalInputs | None = None  # the prompt's images and videos


async def prepare_chat(
    req: ChatCompletionRequest,
    state: ServerState,
    media: list[ProcessedMedia] | None = None,
    *,
    thinking: ThinkingControls,
    max_tokens: int | None,
    client: str = "",
) -> PreparedChat:
    """Edge checks and rendering, all before anything is queued.

    `media`: the request's decoded images and videos in message order (`media.load_media`);
    `thinking`: the request's resolved controls (`resolve_thinking`); `max_tokens`: the output
    limit the context check and the reasoning budget hold to (None: up to the context);
    `client`: who sent it (`edge.client_id`), for its share of the grammar compiles.
    """
    limits = schema_limits(state)
    tools = check_tools(req, limits=limits)
    schema = check_response_format_schema(req, limits=limits)
    if req.response_format is not None and req.response_format.type == "json_object":
        schema = {"type": "object"}
    if thinking.budget is not None:  # a budget beyond the context window is no budget
        thinking = dataclasses.replace(thinking, budget=min(thinking.budget, state.max_model_len))
    extra = {k: v for k, v in (req.chat_template_kwargs or {}).items() if k not in _THINKING_KWARGS}
    options = ChatOptions(
        enable_thinking=thinking.is_enabled,
        reasoning_effort=thinking.effort,
        template_kwargs=extra,
    )
    tool_dicts = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    # Rendering and tokenizing a long conversation takes the CPU for up to seconds (a 1 MB
    # prompt); on a worker thread, the event loop keeps streaming everyone else's tokens.
    ids, multimodal = await run_in_threadpool(
        functools.partial(
            chat_prompt_ids, is_continued=req.continue_final_message
        ),
        state, req.messages, tool_dicts, options, media,
    )  # fmt: skip
    if req.continue_final_message:  # the prompt closed any reasoning: the answer goes on
        thinking = ThinkingControls(is_enabled=False, is_excluded=thinking.is_excluded)
    check_context(len(ids), max_tokens, state.max_model_len, prompt_param="messages")
    forced = tools is not None and (
        req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice)
    )
    grammar, budget = await _grammar(
        req, state, tools, forced, schema, thinking, max_tokens=max_tokens, client=client
    )
    thinking = dataclasses.replace(thinking, budget=budget)
    return PreparedChat(ids, thinking, tools, forced, schema, grammar, multimodal)


def schema_limits(state: ServerState) -> SchemaLimits:
    settings = state.settings
    return SchemaLimits(max_values=settings.max_schema_nodes, max_bytes=settings.max_schema_bytes)


def chat_prompt_ids(
    state: ServerState,
    messages: Sequence[ChatMessage],
    tool_dicts: list[dict[str, Any]] | None,
    options: ChatOptions,
    media: Sequence[ProcessedMedia] | None,
    *,
    is_continued: bool = False,
) -> tuple[list[int], MultimodalInputs | None]:
    """The rendered conversation's token ids, media placeholders expanded, and its media (the
    CPU work of a chat prompt: run it on a worker thread). `is_continued`: the final assistant
    message is left open (prefill)."""
    rendered = render_chat(
        state.chat_template,
        template_messages(messages),
        tools=tool_dicts,
        options=options,
        is_continued=is_continued,
    )
    try:
        ids = state.tokenizer.encode_chat(rendered.segments, max_tokens=state.max_model_len - 1)
    except TokenBudgetExceeded:
        raise prompt_too_long("messages", state.max_model_len) from None
    if not media:
        return ids, None
    assert state.media is not None, "media parts are refused without a vision tower"
    return expand_media(ids, media, state.media, state.tokenizer)


async def _grammar(
    req: ChatCompletionRequest,
    state: ServerState,
    tools: ToolSet | None,
    is_forced: bool,
    schema: dict[str, Any] | bool | None,
    thinking: ThinkingControls,
    *,
    max_tokens: int | None,
    client: str,
) -> tuple[Any, int | None]:
    """The compiled grammar (None: free output) and the reasoning budget it enforces."""
    if tools is not None and is_forced:
        chosen = tools.tools
        is_named = isinstance(req.tool_choice, NamedToolChoice)
        if isinstance(req.tool_choice, NamedToolChoice):
            chosen = tuple(t for t in chosen if t.function.name == req.tool_choice.function.name)
        budget = _forced_budget(thinking, max_tokens)
        tag = tool_call_grammar(
            [(t.function.name, t.function.parameters) for t in chosen],
            # A named choice is one call of that tool, as in OpenAI's API.
            is_parallel=req.parallel_tool_calls and not is_named,
            is_thinking=thinking.is_enabled,
            reasoning_budget=budget,
        )
        return await _compile(state, tag, "tools", InvalidToolSchema, client), budget
    if schema is not None:
        budget = _forced_budget(thinking, max_tokens)
        tag = json_grammar(schema, is_thinking=thinking.is_enabled, reasoning_budget=budget)
        param = "response_format.json_schema.schema"
        return await _compile(state, tag, param, InvalidRequest, client), budget
    if tools is not None and req.tool_choice in (None, "auto"):
        grammar = await _auto_tools(req, state, tools, thinking, client=client)
        if grammar is not None:
            return grammar, thinking.budget
    if thinking.is_enabled and thinking.budget is not None:
        grammar = await state.grammars.compile_in_thread(reasoning_grammar(thinking.budget))
        return grammar, thinking.budget
    return None, thinking.budget


async def _auto_tools(
    req: ChatCompletionRequest,
    state: ServerState,
    tools: ToolSet,
    thinking: ThinkingControls,
    *,
    client: str,
) -> Any:
    """The grammar that holds an opened call to the declared tools (tool_choice auto); None when
    it cannot be built or not in time: the answer then runs free, and a block that is no valid
    call is still dropped by the output parser."""
    tag = auto_tool_grammar(
        [(t.function.name, t.function.parameters) for t in tools.tools],
        is_parallel=req.parallel_tool_calls,
        is_thinking=thinking.is_enabled,
        reasoning_budget=thinking.budget,
    )
    timeout_s = state.settings.grammar_compile_timeout_s
    try:
        return await state.grammars.compile_isolated(tag, client=client, timeout_s=timeout_s)
    except (UnsupportedSchema, GrammarTimeout) as exc:
        logger.warning("tool calls under tool_choice auto run without a grammar: %s", exc)
        return None


async def _compile(
    state: ServerState,
    tag: StructuralTag,
    param: str,
    error: type[InvalidRequest | InvalidToolSchema],
    client: str,
) -> Any:
    """Compile a grammar built from the client's schema (in a process stopped at the deadline);
    one xgrammar refuses is `param`'s fault."""
    timeout_s = state.settings.grammar_compile_timeout_s
    try:
        return await state.grammars.compile_isolated(tag, client=client, timeout_s=timeout_s)
    except UnsupportedSchema as exc:
        raise error(
            f"{param} cannot be enforced as a grammar ({exc}): fix or simplify the schema",
            param=param,
        ) from None
    except GrammarTimeout as exc:
        raise error(
            f"{param} cannot be enforced as a grammar in time ({exc}; "
            "grammar_compile_timeout_s): simplify the schema",
            param=param,
        ) from None


def _forced_budget(thinking: ThinkingControls, max_tokens: int | None) -> int | None:
    """Reasoning budget when the answer is constrained: leave half of max_tokens for it."""
    if not thinking.is_enabled:
        return None
    if max_tokens is None:
        return thinking.budget
    half = max(1, max_tokens // 2)
    return half if thinking.budget is None else min(thinking.budget, half)


def with_processor(
    params: SamplingParams, prepared: PreparedChat, state: ServerState
) -> SamplingParams:
    """Give one choice its own grammar matcher (choices advance independently)."""
    if prepared.grammar is None:
        return params
    return dataclasses.replace(params, logits_processor=state.grammars.processor(prepared.grammar))
