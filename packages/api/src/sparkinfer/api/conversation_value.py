"""The one frozen request value every chat-shaped endpoint becomes at its edge.

Chat completions, Anthropic Messages and OpenAI Responses each translate their wire body into a
`Conversation` once (`Conversation.of` for a chat body, `internal_request` for the fields another
protocol maps to); everything after the edge (the tool and output-format checks, rendering,
sampling, the engine, the output parser) reads this value, never a wire body.

An error raised after the edge names internal fields (`messages[3]`,
`tools[0].function.parameters`); `Conversation.paths` maps them back to the protocol's own
fields (`messages[2].content[1]`, `tools[0].input_schema`), so every 400 names what the client
sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import pydantic
from sparkinfer.api.errors import ApiError, InternalError, InvalidRequest, to_api_error
from sparkinfer.api.sampling import Sampling
from sparkinfer.api.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    Tool,
)
from sparkinfer.model.chat_template import map_reasoning_effort

M = TypeVar("M", bound=pydantic.BaseModel)
ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | None
# chat_template_kwargs the thinking controls own; the rest go to the template as they are.
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
    """A request of any chat-shaped protocol, built once at its edge: its messages, tools,
    output format and template options, its thinking controls, sampling and limits, and where
    its fields came from. Build it with `Conversation.of` (or `internal_request`)."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[Tool, ...]  # (): no tools declared
    tool_choice: ToolChoice
    is_parallel_tool_calls: bool
    response_format: ResponseFormat | None
    template_kwargs: tuple[tuple[str, Any], ...]  # chat_template_kwargs beyond thinking's
    is_continued: bool  # the final assistant message is continued (prefill), not closed
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
        """The conversation a validated chat-completions body (or internal fields) asks for."""
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        kwargs = request.chat_template_kwargs or {}
        return cls(
            messages=tuple(request.messages),
            tools=tuple(request.tools or ()),
            tool_choice=request.tool_choice,
            is_parallel_tool_calls=request.parallel_tool_calls,
            response_format=request.response_format,
            template_kwargs=tuple((k, v) for k, v in kwargs.items() if k not in _THINKING_KWARGS),
            is_continued=request.continue_final_message,
            sampling=Sampling.of(request),
            limits=AnswerLimits(request.n, request.output_limit, logprobs, is_fit_to_context),
            thinking=resolve_thinking(request),
            paths=tuple(paths),
        )

    @property
    def is_tool_call_forced(self) -> bool:
        """tool_choice required or named: only calls may come out."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them; None without tools."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

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
    """The conversation another protocol's body maps to (`fields`, in the chat-completions
    shape, validated as such once here); a value it refuses is a 400 naming the protocol field."""
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
