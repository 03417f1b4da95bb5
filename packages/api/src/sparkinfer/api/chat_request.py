"""A conversation prepared after its edge: tool and format checks, rendered prompt, grammar."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkinfer.api.chat_render import render_chat
from sparkinfer.api.conversation_value import Conversation, ThinkingControls
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
from sparkinfer.api.schemas.chat import ChatMessage, NamedToolChoice
from sparkinfer.api.tools import (
    SchemaLimits,
    ToolSet,
    check_response_format_schema,
    check_tools,
)
from sparkinfer.model.bounded_encode import TokenBudgetExceeded
from sparkinfer.model.chat_template import ChatOptions
from sparkinfer.multimodal import ProcessedMedia
from sparkinfer.scheduler.request import MultimodalInputs, SamplingParams
from starlette.concurrency import run_in_threadpool
from xgrammar.structural_tag import StructuralTag

logger = logging.getLogger("sparkinfer.api")


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
    conv: Conversation,
    state: ServerState,
    media: list[ProcessedMedia] | None = None,
    *,
    max_tokens: int | None,
    client: str = "",
) -> PreparedChat:
    """Checks and rendering, all before anything is queued.

    `media`: the conversation's decoded images and videos in message order
    (`media.load_media`); `max_tokens`: the output limit the context check and the reasoning
    budget hold to (None: up to the context); `client`: who sent it (`edge.client_id`), for its
    share of the grammar compiles.
    """
    limits = schema_limits(state)
    tools = check_tools(conv, limits=limits)
    schema = check_response_format_schema(conv, limits=limits)
    if conv.response_format is not None and conv.response_format.type == "json_object":
        schema = {"type": "object"}
    thinking = conv.thinking
    if thinking.budget is not None:  # a budget beyond the context window is no budget
        thinking = dataclasses.replace(thinking, budget=min(thinking.budget, state.max_model_len))
    # Rendering and tokenizing a long conversation takes the CPU for up to seconds (a 1 MB
    # prompt); on a worker thread, the event loop keeps streaming everyone else's tokens.
    ids, multimodal = await run_in_threadpool(
        conversation_prompt_ids, state, conv, chat_options(conv, thinking), media
    )
    if conv.is_continued:  # the prompt closed any reasoning: the answer goes on
        thinking = ThinkingControls(is_enabled=False, is_excluded=thinking.is_excluded)
    check_context(len(ids), max_tokens, state.max_model_len, prompt_param="messages")
    forced = tools is not None and conv.is_tool_call_forced
    grammar, budget = await _grammar(
        conv, state, tools, schema, thinking, max_tokens=max_tokens, client=client
    )
    thinking = dataclasses.replace(thinking, budget=budget)
    return PreparedChat(ids, thinking, tools, forced, schema, grammar, multimodal)


def conversation_prompt_ids(
    state: ServerState,
    conv: Conversation,
    options: ChatOptions,
    media: Sequence[ProcessedMedia] | None,
) -> tuple[list[int], MultimodalInputs | None]:
    """`chat_prompt_ids` of a conversation (its messages, tools and prefill)."""
    return chat_prompt_ids(
        state, conv.messages, conv.tool_dicts(), options, media, is_continued=conv.is_continued
    )


def chat_options(conv: Conversation, thinking: ThinkingControls) -> ChatOptions:
    """The template's options for `conv` under `thinking` (its controls, maybe adjusted)."""
    return ChatOptions(
        enable_thinking=thinking.is_enabled,
        reasoning_effort=thinking.effort,
        template_kwargs=dict(conv.template_kwargs),
    )


def schema_limits(state: ServerState) -> SchemaLimits:
    limits = state.config.requests
    return SchemaLimits(max_values=limits.max_schema_nodes, max_bytes=limits.max_schema_bytes)


def chat_prompt_ids(
    state: ServerState,
    messages: Sequence[ChatMessage],
    tool_dicts: list[dict[str, Any]] | None,
    options: ChatOptions,
    media: Sequence[ProcessedMedia] | None,
    *,
    is_continued: bool = False,
) -> tuple[list[int], MultimodalInputs | None]:
    """The rendered messages' token ids, media placeholders expanded, and their media (the
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
    conv: Conversation,
    state: ServerState,
    tools: ToolSet | None,
    schema: dict[str, Any] | bool | None,
    thinking: ThinkingControls,
    *,
    max_tokens: int | None,
    client: str,
) -> tuple[Any, int | None]:
    """The compiled grammar (None: free output) and the reasoning budget it enforces."""
    choice = conv.tool_choice
    if tools is not None and conv.is_tool_call_forced:
        chosen = tools.tools
        is_named = isinstance(choice, NamedToolChoice)
        if isinstance(choice, NamedToolChoice):
            chosen = tuple(t for t in chosen if t.function.name == choice.function.name)
        budget = _forced_budget(thinking, max_tokens)
        tag = tool_call_grammar(
            [(t.function.name, t.function.parameters) for t in chosen],
            # A named choice is one call of that tool, as in OpenAI's API.
            is_parallel=conv.is_parallel_tool_calls and not is_named,
            is_thinking=thinking.is_enabled,
            reasoning_budget=budget,
        )
        return await _compile(state, tag, "tools", InvalidToolSchema, client), budget
    if schema is not None:
        budget = _forced_budget(thinking, max_tokens)
        tag = json_grammar(schema, is_thinking=thinking.is_enabled, reasoning_budget=budget)
        param = "response_format.json_schema.schema"
        return await _compile(state, tag, param, InvalidRequest, client), budget
    if tools is not None and choice in (None, "auto"):
        grammar = await _auto_tools(conv, state, tools, thinking, client=client)
        if grammar is not None:
            return grammar, thinking.budget
    if thinking.is_enabled and thinking.budget is not None:
        grammar = await state.grammars.compile_in_thread(reasoning_grammar(thinking.budget))
        return grammar, thinking.budget
    return None, thinking.budget


async def _auto_tools(
    conv: Conversation,
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
        is_parallel=conv.is_parallel_tool_calls,
        is_thinking=thinking.is_enabled,
        reasoning_budget=thinking.budget,
    )
    timeout_s = state.config.requests.grammar_compile_timeout_s
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
    timeout_s = state.config.requests.grammar_compile_timeout_s
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
